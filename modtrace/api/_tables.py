"""Tables for DataFrame users: spans and events with names as plain strings and wall-clock times."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from modtrace.core.contracts import KINDS, PHASES, STATUSES

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.engine import Store


def spans_table(spans: pl.DataFrame, anchors: dict[int, int]) -> pl.DataFrame:
    """A spans frame with names as plain strings and each rank's wall clock added (``wall_start_ns``)."""
    import polars as pl

    frame = pl.DataFrame(
        {"rank": list(anchors), "_anchor": list(anchors.values())},
        schema={"rank": pl.Int32(), "_anchor": pl.Int64()},
    )
    return (
        spans.join(frame, on="rank", how="left", maintain_order="left")
        .with_columns(pl.col(c).cast(pl.String) for c in ("fqn", "module_type", "phase", "device", "status"))
        .with_columns(
            pl.col("status").fill_null("unclosed"),
            (pl.col("_anchor") + pl.col("start_ns")).alias("wall_start_ns"),
        )
        .drop("_anchor")
        .sort("rank", "span_id")
    )


def event_log(store: Store, run_id: int, anchors: dict[int, int]) -> Iterator[pl.DataFrame]:
    """The run's events, rank by rank in seq order, with names instead of codes (as ``event_log``)."""
    import polars as pl

    from modtrace.core.contracts import EVENT_FRAME
    from modtrace.store.reader import iter_event_chunks, read_devices, read_modules, read_ranks

    modules = read_modules(store, run_id).select("rank", "module_id", "fqn", "module_type")
    devices = read_devices(store, run_id).rename({"name": "device"})

    def names(col: str, values: tuple[str, ...]) -> pl.Expr:
        return pl.col(col).replace_strict(list(range(len(values))), list(values), return_dtype=pl.String).alias(col)

    def decode(chunk: pl.DataFrame, anchor: int) -> pl.DataFrame:
        return (
            chunk.join(modules, on=["rank", "module_id"], how="left", maintain_order="left")
            .join(devices, on=["rank", "device_id"], how="left", maintain_order="left")
            .select(
                "run_id", "rank", "seq", "ts_ns", (pl.col("ts_ns") + anchor).alias("wall_ns"),
                names("kind", KINDS), "fqn", "module_type", names("phase", PHASES),
                "call_id", "step", "thread_id", "device", "stream", names("status", STATUSES),
                "graph_task", "tie", "module_id",
            )
        )

    produced = False
    for rank in read_ranks(store, run_id):
        for chunk in iter_event_chunks(store, run_id, rank):
            produced = True
            yield decode(chunk, anchors.get(rank, 0))
    if not produced:  # the columns even without rows
        yield decode(pl.DataFrame(schema=EVENT_FRAME.polars()), 0)
