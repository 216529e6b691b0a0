"""The text of a trace's span events, built column by column in as few pieces as possible.

Each span event is one line of JSON.  Most of a line is the same for every
span of one module on one track (its name, category, pid, tid, fqn, type,
device, stream, status), so that text is formatted once per distinct
combination -- ``line_parts``, a small table -- and joined to the spans.
What varies per span is numbers, turned into text by polars: whole
microseconds by a cast, the three decimals (and the text after them) by
indexing a table of the 1000 endings.  A line is then about fifteen pieces
instead of fifty, and polars' ``concat_str`` costs about the same per piece
whatever its length, so the pieces are what is counted.

The text is byte for byte what the renderer's one-expression-per-field form
wrote before (the golden traces of ``tests/renderers/test_perfetto_golden.py``
check it), including its nulls: a span whose phase,
rank, track, times or status is missing gets no line (an empty one), as
before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import polars as pl

from modtrace.core.codes import Status
from modtrace.core.contracts import KERNELS, STATUSES

# Combination of what the constant parts of a line show; the track (tid) fixes rank, thread and phase.
_KEYS = ("tid", "_fqn_code", "_type_code", "_device_code", "stream", "_status_code")
_UNCLOSED = -1  # _status_code of a span never exited
# A span attributed from compiled kernels is told from one measured by hooks by its slice's
# categories (its phase and "attributed", which trace viewers filter on), a colour of its own
# (cname: Chrome's trace viewer reads it; Perfetto colours a slice by its name) and its args' source.
ATTRIBUTED = STATUSES[Status.ATTRIBUTED]
ATTRIBUTED_COLOR = "olive"
_SOURCE = f'"source": "{KERNELS}", '

# A table is used for a small integer column (step, graph task) when its values span fewer than
# this many per row of the chunk (a table of that many texts is cheaper than a piece more).
_TABLE_SPAN = 0.25


def _endings(after: str) -> pl.Series:
    """'.000' .. '.999', each followed by ``after``: the decimals of a microsecond value by ns % 1000."""
    return pl.Series([f".{i:03d}{after}" for i in range(1000)], dtype=pl.String)


_TS_END = _endings(', "dur": ')
_DUR_END = _endings("")
_SELF_END = _endings("}}")


def _code(frame: pl.DataFrame, column: str) -> pl.Expr:
    """The column's values as small integers, equal where the values are (nulls stay null)."""
    dtype = frame.schema[column]
    if isinstance(dtype, pl.Categorical | pl.Enum):
        return pl.col(column).to_physical().cast(pl.Int64)
    return pl.col(column).cast(pl.String).cast(pl.Categorical).to_physical().cast(pl.Int64)


def _text(value: Any) -> str:
    return "null" if value is None else str(value)


def _json(value: Any) -> str:
    return "null" if value is None else json.dumps(str(value))


def _keyed(trace: pl.DataFrame) -> pl.DataFrame:
    status = pl.when(pl.col("unclosed")).then(pl.lit(_UNCLOSED, dtype=pl.Int64)).otherwise(_code(trace, "status"))
    return trace.select(
        pl.col("tid").cast(pl.Int64), _code(trace, "fqn").alias("_fqn_code"), _code(trace, "module_type").alias("_type_code"),
        _code(trace, "device").alias("_device_code"), pl.col("stream").cast(pl.Int64), status.alias("_status_code"),
    )


@dataclass(frozen=True)
class LineParts:
    """The constant text of a trace's lines, per distinct (track, module, device, stream, status):
    ``table`` has the key columns, ``_key`` (them as one integer, when they fit in one) and the
    text around a line's numbers -- ``_head`` up to ``"ts": ``, ``_args`` up to ``"call_id": ``,
    ``_where`` up to ``"graph_task": ``; null where the line has a missing part (then no line
    is written for it, as before)."""

    table: pl.DataFrame
    streams: pl.Series  # the distinct non-null streams, whose index stands for one in ``_key``
    radices: tuple[int, ...] | None  # each key column's range in ``_key``; None: they do not fit in one
    row_keys: pl.Series | None = None  # ``_key`` of each row of the trace the parts are of (None: no ``_key``)

    def keyed(self, trace: pl.DataFrame) -> pl.DataFrame:
        """The trace these parts are of, with each row's ``_key`` (so chunks of it need not work it out)."""
        return trace if self.row_keys is None else trace.with_columns(self.row_keys)


def _packed(keyed: pl.DataFrame, streams: pl.Series, radices: tuple[int, ...]) -> pl.Expr:
    """The key columns as one integer: each column's value + 1 (null: 0), the stream by its index."""
    key: pl.Expr = pl.lit(0, dtype=pl.Int64)
    for column, radix in zip(_KEYS, radices, strict=True):
        if column == "stream":
            digit = pl.col(column).replace_strict(streams, pl.int_range(1, len(streams) + 1, eager=True),
                                                  default=0, return_dtype=pl.Int64)
        else:
            digit = pl.col(column).fill_null(-1) + 1 if column != "_status_code" else pl.col(column).fill_null(-2) + 2
        key = key * radix + digit
    return key.alias("_key")


def _radices(keyed: pl.DataFrame, streams: pl.Series) -> tuple[int, ...] | None:
    radices = []
    for column in _KEYS:
        if column == "stream":
            radices.append(len(streams) + 1)
            continue
        values = keyed[column]
        low, high = values.min(), values.max()
        floor = -2 if column == "_status_code" else -1
        if low is not None and int(low) < floor:  # type: ignore[arg-type]
            return None
        radices.append(int(high) + 1 - floor if high is not None else 1)  # type: ignore[arg-type]
    product = 1
    for radix in radices:
        product *= radix
    return tuple(radices) if product < (1 << 62) else None


def line_parts(trace: pl.DataFrame) -> LineParts:
    """The constant parts of the lines of ``trace`` (a trace frame with ``tid``)."""
    keyed = _keyed(trace)
    streams = keyed["stream"].drop_nulls().unique().sort()
    radices = _radices(keyed, streams)
    keyed = keyed.with_row_index("_row")
    first = keyed.unique(subset=list(_KEYS), keep="first", maintain_order=True)
    shown = trace[first["_row"]].select(
        "rank", "thread_id", "phase", "tid", "fqn", "module_type", "device", "stream", "status", "unclosed"
    )
    heads, args, wheres = [], [], []
    for rank, thread, phase, tid, fqn, mtype, device, stream, status, unclosed in shown.iter_rows():
        fqn_text = _json(fqn)
        ok = phase is not None and rank is not None and tid is not None
        attributed = status == ATTRIBUTED and not unclosed
        cat = f'"{phase},{ATTRIBUTED}", "cname": "{ATTRIBUTED_COLOR}"' if attributed else f'"{phase}"'
        heads.append(f'{{"ph": "X", "cat": {cat}, "name": {fqn_text}, "pid": {rank + 1}, "tid": {tid}, "ts": '
                     if ok else None)
        args.append(f', "args": {{"fqn": {fqn_text}, "module_type": {_json(mtype)}, "phase": "{phase}", "call_id": '
                    if phase is not None else None)
        status_text = "unclosed" if unclosed else status
        wheres.append(
            f', "rank": {_text(rank)}, "thread_id": {_text(thread)}, "device": {_json(device)}, '
            f'"stream": {_text(stream)}, "status": "{status_text}", {_SOURCE if attributed else ""}"graph_task": '
            if status_text is not None else None
        )
    table = first.drop("_row").with_columns(
        pl.Series("_head", heads, dtype=pl.String), pl.Series("_args", args, dtype=pl.String),
        pl.Series("_where", wheres, dtype=pl.String),
    )
    if radices is None:
        return LineParts(table, streams, radices)
    table = table.with_columns(_packed(table, streams, radices))
    return LineParts(table, streams, radices, keyed.select(_packed(keyed, streams, radices)).to_series())


def _join_parts(chunk: pl.DataFrame, parts: LineParts) -> pl.DataFrame:
    texts = ["_head", "_args", "_where"]
    if parts.radices is not None and "_key" in chunk.columns:
        found = chunk.select("_key").join(parts.table.select("_key", *texts), on="_key", how="left",
                                          maintain_order="left")
        return chunk.with_columns(found.select(texts))
    keyed = _keyed(chunk)
    if parts.radices is None:
        found = keyed.join(parts.table.select(*_KEYS, *texts), on=list(_KEYS), how="left", nulls_equal=True,
                           maintain_order="left")
    else:
        found = keyed.select(_packed(keyed, parts.streams, parts.radices)).join(
            parts.table.select("_key", *texts), on="_key", how="left", maintain_order="left")
    return chunk.with_columns(found.select(texts))


def _number(frame: pl.DataFrame, column: str, before: str = "", after: str = "") -> list[pl.Expr]:
    """``before``, the column's integers as text (null: ``null``), ``after``: one piece from a
    table when the values span a small range, else the literals around a cast."""
    values = frame[column]
    low, high = values.min(), values.max()
    if low is None or high is None or int(high) - int(low) >= _TABLE_SPAN * frame.height:  # type: ignore[arg-type]
        piece = pl.col(column).cast(pl.String).fill_null("null")
        return [*([pl.lit(before)] if before else []), piece, *([pl.lit(after)] if after else [])]
    low, high = int(low), int(high)  # type: ignore[arg-type]
    table = pl.Series([f"{before}{v}{after}" for v in range(low, high + 1)] + [f"{before}null{after}"], dtype=pl.String)
    return [pl.lit(table).gather((pl.col(column).cast(pl.Int64) - low).fill_null(high - low + 1))]


def span_lines(chunk: pl.DataFrame, parts: LineParts) -> pl.Series:
    """The JSON line of each span of ``chunk`` (rows of a trace frame with ``tid``), from the
    constant parts of ``line_parts``."""
    joined = _join_parts(chunk, parts)
    t0, dur, self_ns = pl.col("t0"), pl.col("t1") - pl.col("t0"), pl.col("self_ns")
    has_self = self_ns.is_not_null() & (self_ns >= 0)
    pieces = [
        pl.col("_head"), (t0 // 1000).cast(pl.String), pl.lit(_TS_END).gather(t0 % 1000),
        (dur // 1000).cast(pl.String), pl.lit(_DUR_END).gather(dur % 1000),
        pl.col("_args"), *_number(joined, "call_id"), *_number(joined, "step", ', "step": '),
        pl.col("_where"), *_number(joined, "graph_task", after=', "span_id": '),
        *_number(joined, "span_id", after=', "parent_span_id": '),
        *_number(joined, "parent_span_id", after=', "self_us": '),
        pl.when(has_self).then((self_ns // 1000).cast(pl.String)).otherwise(pl.lit("null")),
        pl.when(has_self).then(pl.lit(_SELF_END).gather(self_ns % 1000)).otherwise(pl.lit("}}")),
    ]
    # each piece its own column first: polars computes the columns side by side, on every core
    columns = joined.select(p.alias(f"_{i}") for i, p in enumerate(pieces))
    return columns.select(pl.concat_str(columns.columns).alias("line")).to_series()
