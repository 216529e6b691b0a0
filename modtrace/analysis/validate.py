"""Validate: rows analysis cannot trust become nesting issues, not crashes.

A hand-edited or foreign row (a tool, a bad migration, a disk error) may
carry a code no modtrace writes, a module with no ``modules`` row, a
negative timestamp; rows may be missing.  ``validate`` is a pure step before
``normalize_events``: event frame and module frame in, (the rows analysis
can use, an issues frame) out.  Kinds, each naming the seq:

- ``invalid_row`` error: an unknown kind, phase or status code, a module_id
  with no modules row, or a negative ts_ns.  The row is left out of the
  analysis (its neighbours then show what it broke).
- ``time_reversed`` warning: ts_ns earlier than the row before it on the
  same thread (by seq).  The row stays.
- ``seq_gap`` warning: seqs missing between two rows of a rank (rows
  deleted, or steps the recorder dropped while the database was down).
"""

from __future__ import annotations

import polars as pl

from modtrace.analysis.events import EVENT_SCHEMA, MODULE_SCHEMA, PHASE_ENUM, conform
from modtrace.core.codes import OUT_OF_RANGE_CODE, Kind, Phase, Status
from modtrace.core.contracts import ISSUE_FRAME, ISSUE_KINDS, VALIDATION_ISSUE_KINDS

_ISSUE_SCHEMA: dict[str, pl.DataType] = ISSUE_FRAME.polars()
VALIDATION_KINDS: dict[str, str] = {k: ISSUE_KINDS[k] for k in VALIDATION_ISSUE_KINDS}

_KINDS = [int(k) for k in Kind]
_PHASES = [int(p) for p in Phase]
_STATUSES = [int(s) for s in Status]


def _unknown_code(column: str, known: list[int]) -> pl.Expr:
    code = pl.col(column)
    return (
        pl.when(code == OUT_OF_RANGE_CODE)
        .then(pl.lit(f"{column} code out of range"))
        .when(~code.is_in(known))
        .then(pl.format(f"unknown {column} code {{}}", code))
    )


def validate(events: pl.DataFrame, modules: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Event frame, module frame -> (usable event rows, issues frame of ``contracts.ISSUE_FRAME``)."""

    ev = conform(events, EVENT_SCHEMA)
    if not ev.height:
        return ev, pl.DataFrame(schema=_ISSUE_SCHEMA)
    names = conform(modules, MODULE_SCHEMA).select("rank", "module_id", "fqn").unique(["rank", "module_id"])
    ev = ev.join(names, on=["rank", "module_id"], how="left", maintain_order="left")
    why = pl.concat_str(
        [
            *(_unknown_code(column, known) for column, known in (("kind", _KINDS), ("phase", _PHASES), ("status", _STATUSES))),
            pl.when(pl.col("fqn").is_null()).then(pl.format("module_id {} has no modules row", pl.col("module_id"))),
            pl.when(pl.col("ts_ns") < 0).then(pl.format("negative ts_ns {}", pl.col("ts_ns"))),
        ],
        separator="; ",
        ignore_nulls=True,
    )
    ev = ev.with_columns(why.alias("why"))
    ev = ev.with_columns(pl.when(pl.col("why") == "").then(None).otherwise(pl.col("why")).alias("why"))
    bad = ev.filter(pl.col("why").is_not_null())
    good = ev.filter(pl.col("why").is_null()).sort("rank", "seq")
    parts = []
    if bad.height:
        parts.append(bad.select(
            "run_id", "rank", "seq", pl.lit("invalid_row").alias("kind"), pl.lit("error").alias("severity"), "fqn",
            "phase", "call_id", "step", "thread_id",
            pl.format("row at seq {} is not valid: {}; left out of the analysis", pl.col("seq"), pl.col("why")).alias("message"),
        ))
    prev_ts = pl.col("ts_ns").shift(1).over("rank", "thread_id")
    back = good.sort("rank", "thread_id", "seq").with_columns(prev_ts.alias("prev_ts")).filter(pl.col("ts_ns") < pl.col("prev_ts"))
    if back.height:
        parts.append(back.select(
            "run_id", "rank", "seq", pl.lit("time_reversed").alias("kind"), pl.lit("warning").alias("severity"), "fqn",
            "phase", "call_id", "step", "thread_id",
            pl.format("row at seq {} has ts_ns {}, earlier than {} of the row before it on thread {}",
                      pl.col("seq"), pl.col("ts_ns"), pl.col("prev_ts"), pl.col("thread_id")).alias("message"),
        ))
    with_prev = ev.sort("rank", "seq").with_columns(pl.col("seq").shift(1).over("rank").alias("prev_seq"))
    gaps = with_prev.filter(pl.col("seq") - pl.col("prev_seq") > 1)
    if gaps.height:
        parts.append(gaps.select(
            "run_id", "rank", "seq", pl.lit("seq_gap").alias("kind"), pl.lit("warning").alias("severity"), "fqn",
            "phase", "call_id", "step", "thread_id",
            pl.format("seq {} to {} missing before the row at seq {}", pl.col("prev_seq") + 1, pl.col("seq") - 1,
                      pl.col("seq")).alias("message"),
        ))
    if not parts:
        return good.drop("fqn", "why"), pl.DataFrame(schema=_ISSUE_SCHEMA)
    issues = pl.concat(parts, how="vertical_relaxed").with_columns(
        pl.when(pl.col("phase").is_in(_PHASES)).then(pl.col("phase")).otherwise(None).alias("phase"),
    ).with_columns(pl.col("phase").cast(pl.UInt32).cast(pl.String).replace_strict(
        {str(i): c for i, c in enumerate(PHASE_ENUM.categories)}, default=None).cast(PHASE_ENUM))
    return good.drop("fqn", "why"), issues.select(ISSUE_FRAME.names).cast(_ISSUE_SCHEMA)  # type: ignore[arg-type]
