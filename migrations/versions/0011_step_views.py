"""views span_steps and steps: each span's step and each step's times under the run's
step rule (root calls or optimizer steps), read by the shipped step queries; root calls are
the outermost calls of every thread, no longer of the main thread only

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 10:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# Written out here, not imported, so this revision stays as released.
_SPAN_STEPS = """CREATE VIEW span_steps AS
WITH rules AS (
    SELECT
        r.id AS run_id,
        CASE WHEN COALESCE(r.step_on, 'optimizer') <> 'auto' THEN COALESCE(r.step_on, 'optimizer')
            WHEN EXISTS (SELECT 1 FROM run_ranks rr WHERE rr.run_id = r.id AND rr.step_count > 0) THEN 'optimizer'
            ELSE 'root' END AS step_rule
    FROM runs r
),
marked AS (
    -- root_ord: a root call's place among its rank's root calls, in start order
    SELECT
        s.run_id, s.rank, s.span_id, s.thread_id, s.step, s.depth, s.phase, s.start_ns, s.duration_ns, s.self_ns,
        CASE WHEN rc.seq IS NOT NULL THEN COUNT(rc.seq) OVER (PARTITION BY s.run_id, s.rank ORDER BY s.span_id) END AS root_ord
    FROM span_rows s
    LEFT JOIN root_calls rc ON rc.run_id = s.run_id AND rc.rank = s.rank AND rc.seq = s.span_id
),
latest AS (
    -- the latest root call entered on the span's thread, else on its rank
    SELECT
        run_id, rank, span_id, step, depth, phase, start_ns, duration_ns, self_ns,
        COALESCE(
            MAX(root_ord) OVER (PARTITION BY run_id, rank, thread_id ORDER BY span_id),
            MAX(root_ord) OVER (PARTITION BY run_id, rank ORDER BY span_id),
            0) AS root_ord
    FROM marked
),
stepped AS (
    SELECT
        l.run_id, l.rank, l.span_id,
        CASE WHEN u.step_rule = 'root'
            THEN DENSE_RANK() OVER (PARTITION BY l.run_id, l.rank ORDER BY l.step, l.root_ord) - 1
            ELSE l.step END AS step,
        l.step AS recorded_step, u.step_rule, l.depth, l.phase, l.start_ns, l.duration_ns, l.self_ns
    FROM latest l
    JOIN rules u ON u.run_id = l.run_id
)
SELECT run_id, rank, span_id, step, recorded_step, step_rule
FROM stepped
"""

_STEPS = """CREATE VIEW steps AS
WITH rules AS (
    SELECT
        r.id AS run_id,
        CASE WHEN COALESCE(r.step_on, 'optimizer') <> 'auto' THEN COALESCE(r.step_on, 'optimizer')
            WHEN EXISTS (SELECT 1 FROM run_ranks rr WHERE rr.run_id = r.id AND rr.step_count > 0) THEN 'optimizer'
            ELSE 'root' END AS step_rule
    FROM runs r
),
marked AS (
    -- root_ord: a root call's place among its rank's root calls, in start order
    SELECT
        s.run_id, s.rank, s.span_id, s.thread_id, s.step, s.depth, s.phase, s.start_ns, s.duration_ns, s.self_ns,
        CASE WHEN rc.seq IS NOT NULL THEN COUNT(rc.seq) OVER (PARTITION BY s.run_id, s.rank ORDER BY s.span_id) END AS root_ord
    FROM span_rows s
    LEFT JOIN root_calls rc ON rc.run_id = s.run_id AND rc.rank = s.rank AND rc.seq = s.span_id
),
latest AS (
    -- the latest root call entered on the span's thread, else on its rank
    SELECT
        run_id, rank, span_id, step, depth, phase, start_ns, duration_ns, self_ns,
        COALESCE(
            MAX(root_ord) OVER (PARTITION BY run_id, rank, thread_id ORDER BY span_id),
            MAX(root_ord) OVER (PARTITION BY run_id, rank ORDER BY span_id),
            0) AS root_ord
    FROM marked
),
stepped AS (
    SELECT
        l.run_id, l.rank, l.span_id,
        CASE WHEN u.step_rule = 'root'
            THEN DENSE_RANK() OVER (PARTITION BY l.run_id, l.rank ORDER BY l.step, l.root_ord) - 1
            ELSE l.step END AS step,
        l.step AS recorded_step, u.step_rule, l.depth, l.phase, l.start_ns, l.duration_ns, l.self_ns
    FROM latest l
    JOIN rules u ON u.run_id = l.run_id
),
covering AS (
    -- covered: the latest end of the step's closed root spans started before this one
    SELECT
        run_id, rank, step, step_rule, depth, phase, start_ns, duration_ns, self_ns,
        MAX(CASE WHEN depth = 0 THEN start_ns + duration_ns END) OVER (
            PARTITION BY run_id, rank, step ORDER BY start_ns, span_id
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered
    FROM stepped
),
per_step AS (
    SELECT
        run_id, rank, step,
        MIN(step_rule) AS step_rule,
        MIN(start_ns) AS start_ns,
        MAX(COALESCE(start_ns + duration_ns, start_ns)) AS last_ns,
        CAST(SUM(CASE WHEN depth <> 0 OR duration_ns IS NULL THEN 0
            WHEN covered IS NULL OR start_ns >= covered THEN duration_ns
            WHEN start_ns + duration_ns > covered THEN start_ns + duration_ns - covered
            ELSE 0 END) AS BIGINT) AS step_ns,
        CAST(SUM(CASE WHEN phase = 0 THEN COALESCE(self_ns, 0) ELSE 0 END) AS BIGINT) AS forward_ns,
        CAST(SUM(CASE WHEN phase = 1 THEN COALESCE(self_ns, 0) ELSE 0 END) AS BIGINT) AS backward_ns,
        CAST(SUM(CASE WHEN phase = 2 THEN COALESCE(self_ns, 0) ELSE 0 END) AS BIGINT) AS recompute_ns,
        COUNT(*) AS spans,
        CAST(SUM(CASE WHEN duration_ns IS NULL THEN 1 ELSE 0 END) AS BIGINT) AS unclosed
    FROM covering
    GROUP BY run_id, rank, step
),
bounded AS (
    -- the next step's start ends a step when it is the next step and the step is over by then
    SELECT
        run_id, rank, step, step_rule, start_ns, last_ns, step_ns, forward_ns, backward_ns, recompute_ns,
        spans, unclosed,
        CASE WHEN LEAD(step) OVER (PARTITION BY run_id, rank ORDER BY step) = step + 1
            THEN LEAD(start_ns) OVER (PARTITION BY run_id, rank ORDER BY step) END AS next_ns
    FROM per_step
)
SELECT
    run_id,
    rank,
    step,
    step_rule,
    start_ns,
    CASE WHEN next_ns IS NULL OR last_ns > next_ns THEN last_ns ELSE next_ns END - start_ns AS wall_ns,
    step_ns,
    forward_ns,
    backward_ns,
    recompute_ns,
    spans,
    unclosed
FROM bounded
"""

_OLD_COMMENT = "Root calls: the outermost module calls on the main thread (each model(...) of a generate() or serving loop). Steps start at them when a run's steps follow root calls."
_NEW_COMMENT = "Root calls: the outermost module calls of each thread (each model(...) of a generate() loop, each request a serving loop handles on any thread). Steps start at them when a run's steps follow root calls."


def _comment(text: str, old: str) -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite keeps no comments
        op.create_table_comment("root_calls", text, existing_comment=old)


def upgrade() -> None:
    op.execute(_SPAN_STEPS)
    op.execute(_STEPS)
    _comment(_NEW_COMMENT, _OLD_COMMENT)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS steps")
    op.execute("DROP VIEW IF EXISTS span_steps")
    _comment(_OLD_COMMENT, _NEW_COMMENT)
