"""The cross-rank reduction behind ``modtrace stragglers``, run as SQL where the rows are.

One statement over the stored analysis (``span_rows`` with each span's step found as the
``span_steps`` view finds it, in one pass; ``steps``, ``modules``, ``run_ranks``) sums each rank's own (self) time per (step, module, phase) and reduces it over the
ranks: the median, the median of the ranks other than the slowest, the quartiles, the minimum
and the maximum with their ranks, and how much later the slowest rank left the module than the
others (on the wall clock the ranks share).  A second part of the same statement gives per (step, rank) the rank's self time beside
the modules' medians, so a rank slower in every module alike can be told from one slow module.
What leaves the database is bounded by steps x (modules + ranks), never by spans.

Medians use ``ROW_NUMBER()``/``COUNT(*)`` windows, so the one statement runs on SQLite and
PostgreSQL alike (docs/schema.md, "Query library").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from modtrace.core.contracts import PHASES
from modtrace.store.cursor import driver_cursor, mark
from modtrace.store.engine import Store

if TYPE_CHECKING:
    import polars as pl

# The steps every rank recorded (``ranks`` ranks), from ``:skip`` on; with a step kind, only the
# steps whose root call on every rank has that kind.
_SHARED = """
shared AS (
    SELECT step FROM steps
    WHERE run_id = {p} AND step >= {p}
    GROUP BY step
    HAVING COUNT(*) = {ranks}
),"""

_SHARED_KIND = """
kinds AS (
    SELECT t.rank, t.step, MIN(COALESCE(r.kind, '-')) AS kind
    FROM root_calls r
    JOIN span_steps t ON t.run_id = r.run_id AND t.rank = r.rank AND t.span_id = r.seq
    WHERE r.run_id = {p}
    GROUP BY t.rank, t.step
),
shared AS (
    SELECT s.step FROM steps s
    LEFT JOIN kinds k ON k.rank = s.rank AND k.step = s.step
    WHERE s.run_id = {p} AND s.step >= {p} AND COALESCE(k.kind, '-') = {p}
    GROUP BY s.step
    HAVING COUNT(*) = {ranks}
),"""

_BODY = """
-- each span's step as the span_steps view finds it (the latest step_starts row of its thread at
-- or before it), read from span_rows in one pass instead of the view joined back to spans
numbered AS (
    SELECT s.rank, s.module_id, s.phase, s.thread_id, s.self_ns, s.start_ns + s.duration_ns AS end_ns,
           COUNT(a.span_id) OVER (PARTITION BY s.rank, s.thread_id ORDER BY s.span_id) AS nth
    FROM span_rows s
    LEFT JOIN step_starts a ON a.run_id = s.run_id AND a.rank = s.rank AND a.thread_id = s.thread_id
                           AND a.span_id = s.span_id
    WHERE s.run_id = {p} AND s.self_ns IS NOT NULL
      -- closed when the graph task ended: its time runs on through the end-of-backward
      -- callbacks (DDP's reducer waiting for its all-reduce), not the module's own work
      AND (s.status IS NULL OR s.status <> 3)
),
by_id AS (
    SELECT b.step, n.rank, n.module_id, n.phase,
           CAST(SUM(n.self_ns) AS BIGINT) AS self_ns, MAX(n.end_ns) AS end_ns
    FROM numbered n
    JOIN step_starts b ON b.run_id = {p} AND b.rank = n.rank AND b.thread_id = n.thread_id AND b.nth = n.nth
    JOIN shared h ON h.step = b.step
    GROUP BY b.step, n.rank, n.module_id, n.phase
),
cell AS (
    SELECT i.step, i.rank, m.fqn, i.phase, CAST(SUM(i.self_ns) AS BIGINT) AS self_ns,
           MAX(i.end_ns) + MIN(a.wall_anchor_ns - {p}) AS end_ns
    FROM by_id i
    JOIN modules m ON m.run_id = {p} AND m.rank = i.rank AND m.module_id = i.module_id
    JOIN run_ranks a ON a.run_id = {p} AND a.rank = i.rank
    GROUP BY i.step, i.rank, m.fqn, i.phase
),
ranked AS (
    SELECT step, rank, fqn, phase, self_ns, end_ns,
           ROW_NUMBER() OVER (PARTITION BY step, fqn, phase ORDER BY self_ns, rank DESC) AS pos,
           ROW_NUMBER() OVER (PARTITION BY step, fqn, phase ORDER BY end_ns, rank) AS end_pos,
           COUNT(*) OVER (PARTITION BY step, fqn, phase) AS n
    FROM cell
),
module AS (
    SELECT step, fqn, phase,
           MAX(n) AS ranks,
           AVG(CASE WHEN pos = (n + 1) / 2 OR pos = (n + 2) / 2 THEN CAST(self_ns AS DOUBLE PRECISION) END)
               AS median_ns,
           AVG(CASE WHEN n > 1 AND (pos = n / 2 OR pos = (n + 1) / 2) THEN CAST(self_ns AS DOUBLE PRECISION) END)
               AS others_ns,
           MAX(CASE WHEN pos = (n + 3) / 4 THEN self_ns END) AS q1_ns,
           MAX(CASE WHEN pos = (3 * n + 3) / 4 THEN self_ns END) AS q3_ns,
           MIN(self_ns) AS min_ns,
           MAX(CASE WHEN pos = 1 THEN rank END) AS min_rank,
           MAX(self_ns) AS max_ns,
           MAX(CASE WHEN pos = n THEN rank END) AS max_rank,
           -- how much later the slowest rank left the module than the others (one clock):
           -- a rank waiting at a collective leaves with the others, a straggler after them
           MAX(CASE WHEN pos = n THEN CAST(end_ns AS DOUBLE PRECISION) END)
               - CASE WHEN MAX(n) = 2 THEN MAX(CASE WHEN pos = 1 THEN CAST(end_ns AS DOUBLE PRECISION) END)
                      ELSE AVG(CASE WHEN end_pos = (n + 1) / 2 OR end_pos = (n + 2) / 2
                                    THEN CAST(end_ns AS DOUBLE PRECISION) END) END AS max_late_ns
    FROM ranked
    GROUP BY step, fqn, phase
),
per_rank AS (
    SELECT c.step, c.rank,
           CAST(SUM(c.self_ns) AS BIGINT) AS self_ns,
           SUM(CASE WHEN c.rank = m.max_rank AND m.ranks > 1 THEN m.others_ns ELSE m.median_ns END) AS median_ns,
           SUM(CASE WHEN c.self_ns > m.median_ns THEN 1 ELSE 0 END) AS above,
           COUNT(*) AS cells,
           MAX(c.self_ns - CASE WHEN c.rank = m.max_rank AND m.ranks > 1 THEN m.others_ns ELSE m.median_ns END)
               AS top_excess_ns
    FROM cell c
    JOIN module m ON m.step = c.step AND m.fqn = c.fqn AND m.phase = c.phase
    GROUP BY c.step, c.rank
)
SELECT 'module' AS part, step, max_rank AS rank, fqn, CAST(phase AS INTEGER) AS phase, ranks AS n, median_ns, others_ns,
       CAST(q1_ns AS DOUBLE PRECISION) AS a_ns, CAST(q3_ns AS DOUBLE PRECISION) AS b_ns,
       CAST(min_ns AS DOUBLE PRECISION) AS c_ns, min_rank AS other_rank,
       CAST(max_ns AS DOUBLE PRECISION) AS d_ns, max_late_ns AS e_ns
FROM module
UNION ALL
SELECT 'rank', p.step, p.rank, NULL, NULL, p.cells, p.median_ns, CAST(p.above AS DOUBLE PRECISION),
       CAST(p.self_ns AS DOUBLE PRECISION), CAST(p.top_excess_ns AS DOUBLE PRECISION),
       CAST(st.wall_ns AS DOUBLE PRECISION), NULL,
       CAST(st.step_ns AS DOUBLE PRECISION), NULL
FROM per_rank p
JOIN steps st ON st.run_id = {p} AND st.rank = p.rank AND st.step = p.step
"""


@dataclass(frozen=True)
class RankTables:
    """What the reduction returns: ``modules`` per (step, fqn, phase) over the ranks and
    ``ranks`` per (step, rank)."""

    modules: pl.DataFrame
    ranks: pl.DataFrame


def _schema() -> dict[str, pl.DataType]:
    import polars as pl

    f, i = pl.Float64(), pl.Int64()
    return {"part": pl.String(), "step": i, "rank": i, "fqn": pl.String(), "phase": i, "n": i,
            "median_ns": f, "others_ns": f, "a_ns": f, "b_ns": f, "c_ns": f, "other_rank": i, "d_ns": f, "e_ns": f}


def reduce_ranks(store: Store, run_id: int, ranks: int, *, skip_steps: int = 0,
                 step_kind: str | None = None) -> RankTables:
    """The run's per-(step, module, phase) and per-(step, rank) reductions over its ``ranks``
    ranks, on the steps every rank recorded (``step >= skip_steps``; of ``step_kind`` only)."""
    import polars as pl

    p = mark(store)
    head = (_SHARED_KIND if step_kind is not None else _SHARED).format(p=p, ranks=int(ranks))
    sql = "WITH" + head + _BODY.format(p=p)
    params: list[object] = [run_id, int(skip_steps)]
    if step_kind is not None:
        params = [run_id, run_id, int(skip_steps), step_kind]
    params += [run_id, run_id, _base_anchor(store, run_id), run_id, run_id, run_id]
    with driver_cursor(store) as cur:
        cur.execute(sql, tuple(params))
        rows = cur.fetchall()
    frame = pl.DataFrame(rows, schema=_schema(), orient="row")
    phases = pl.col("phase").replace_strict(dict(enumerate(PHASES)), default=None, return_dtype=pl.String)
    modules = frame.filter(pl.col("part") == "module").select(
        "step", "fqn", phases.alias("phase"), pl.col("n").alias("ranks"), "median_ns", "others_ns",
        pl.col("a_ns").alias("q1_ns"), pl.col("b_ns").alias("q3_ns"), pl.col("c_ns").alias("min_ns"),
        pl.col("other_rank").alias("min_rank"), pl.col("d_ns").alias("max_ns"), pl.col("rank").alias("max_rank"),
        pl.col("e_ns").alias("max_late_ns")).sort("step", "fqn", "phase")
    per_rank = frame.filter(pl.col("part") == "rank").select(
        "step", "rank", pl.col("n").alias("cells"), pl.col("others_ns").alias("above"),
        pl.col("a_ns").alias("self_ns"), pl.col("median_ns").alias("median_sum_ns"),
        pl.col("b_ns").alias("top_excess_ns"), pl.col("c_ns").alias("wall_ns"),
        pl.col("d_ns").alias("busy_ns")).sort("step", "rank")
    return RankTables(modules, per_rank)


def _base_anchor(store: Store, run_id: int) -> int:
    """The run's earliest rank anchor: wall-clock times relative to it stay exact as doubles."""
    p = mark(store)
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT MIN(wall_anchor_ns) FROM run_ranks WHERE run_id = {p}", (run_id,))
        row = cur.fetchone()
    return int(row[0] or 0)


def recorded_steps(store: Store, run_id: int) -> dict[int, list[int]]:
    """rank -> the steps it has in the ``steps`` view (the run's stored analysis), ascending."""
    p = mark(store)
    out: dict[int, list[int]] = {}
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT rank, step FROM steps WHERE run_id = {p} ORDER BY rank, step", (run_id,))
        for rank, step in cur.fetchall():
            out.setdefault(int(rank), []).append(int(step))
    return out
