"""tables step_rows and step_starts: a run's steps under its own step rule, stored with its
spans by the analysis; the views steps and span_steps read them by key instead of
computing them from every run's spans on each read (filled here from the views they replace)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_RULE = "optimizer | manual | root: the step rule the steps follow (the run's own, resolved from runs.step_on)."

# The views as released here, written out (not imported from modtrace.store.create, which moves on).
_SPAN_STEPS = """
CREATE VIEW span_steps AS
SELECT c.run_id, c.rank, c.span_id, b.step, c.recorded_step, t.step_rule
FROM (
    -- nth: the thread's step_starts rows at or before the span (the latest is its step's)
    SELECT
        s.run_id, s.rank, s.span_id, s.thread_id, s.step AS recorded_step,
        COUNT(a.span_id) OVER (PARTITION BY s.run_id, s.rank, s.thread_id ORDER BY s.span_id) AS nth
    FROM span_rows s
    LEFT JOIN step_starts a ON a.run_id = s.run_id AND a.rank = s.rank AND a.thread_id = s.thread_id AND a.span_id = s.span_id
) c
JOIN step_starts b ON b.run_id = c.run_id AND b.rank = c.rank AND b.thread_id = c.thread_id AND b.nth = c.nth
JOIN step_rows t ON t.run_id = b.run_id AND t.rank = b.rank AND t.step = b.step
"""

_STEPS = """
CREATE VIEW steps AS
SELECT
    run_id,
    rank,
    step,
    step_rule,
    start_ns,
    wall_ns,
    step_ns,
    forward_ns,
    backward_ns,
    recompute_ns,
    spans,
    unclosed
FROM step_rows
"""

# The runs analysed before this revision: their steps as the views being replaced computed them.
_FILL_STEP_ROWS = """
INSERT INTO step_rows (run_id, rank, step, step_rule, start_ns, wall_ns, step_ns, forward_ns, backward_ns,
                       recompute_ns, spans, unclosed)
SELECT run_id, rank, step, step_rule, start_ns, wall_ns, step_ns, forward_ns, backward_ns, recompute_ns, spans, unclosed
FROM steps
"""
_FILL_STEP_STARTS = """
INSERT INTO step_starts (run_id, rank, thread_id, span_id, step, nth)
SELECT run_id, rank, thread_id, span_id, step,
    ROW_NUMBER() OVER (PARTITION BY run_id, rank, thread_id ORDER BY span_id) AS nth
FROM (
    SELECT
        t.run_id, t.rank, s.thread_id, t.span_id, t.step,
        LAG(t.step) OVER (PARTITION BY t.run_id, t.rank, s.thread_id ORDER BY t.span_id) AS previous
    FROM span_steps t
    JOIN span_rows s ON s.run_id = t.run_id AND s.rank = t.rank AND s.span_id = t.span_id
) changes
WHERE previous IS NULL OR previous <> step
"""

# The views this revision replaces: revision 0013's steps and revision 0011's span_steps.
_OLD_SPAN_STEPS = """CREATE VIEW span_steps AS
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

_OLD_STEPS = """CREATE VIEW steps AS
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
        CAST(SUM(CASE WHEN phase IN (1, 3) THEN COALESCE(self_ns, 0) ELSE 0 END) AS BIGINT) AS backward_ns,
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


def upgrade() -> None:
    op.create_table(
        "step_rows",
        sa.Column("run_id", sa.Integer(), nullable=False, comment="The run (runs.id)."),
        sa.Column("rank", sa.Integer(), nullable=False, comment="Rank that recorded the step."),
        sa.Column("step", sa.Integer(), nullable=False, comment="Step under the run's step rule, from 0."),
        sa.Column("step_rule", sa.String(16), nullable=False, comment=_RULE),
        sa.Column("start_ns", sa.BigInteger(), nullable=False, comment="start_ns of the step's first span."),
        sa.Column("wall_ns", sa.BigInteger(), nullable=False, comment="Wall time of the step in nanoseconds (modtrace.analysis.step_time)."),
        sa.Column("step_ns", sa.BigInteger(), nullable=False, comment="Step time in nanoseconds: the union of the step's closed root spans (modtrace.analysis.step_time)."),
        sa.Column("forward_ns", sa.BigInteger(), nullable=False, comment="Summed self_ns of the step's forward spans."),
        sa.Column("backward_ns", sa.BigInteger(), nullable=False, comment="Summed self_ns of the step's backward and backward_call spans."),
        sa.Column("recompute_ns", sa.BigInteger(), nullable=False, comment="Summed self_ns of the step's recompute spans."),
        sa.Column("spans", sa.BigInteger(), nullable=False, comment="Spans entered in the step."),
        sa.Column("unclosed", sa.BigInteger(), nullable=False, comment="Spans of the step never exited."),
        sa.PrimaryKeyConstraint("run_id", "rank", "step", name="pk_step_rows"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_step_rows_run"),
        sqlite_with_rowid=False,
        comment="The step table of a run under its own step rule (modtrace.analysis.step_time.step_table), written by modtrace analyze with the spans and replaced with them; the steps view reads it.",
    )
    op.create_table(
        "step_starts",
        sa.Column("run_id", sa.Integer(), nullable=False, comment="The run (runs.id)."),
        sa.Column("rank", sa.Integer(), nullable=False, comment="Rank that recorded the spans."),
        sa.Column("thread_id", sa.Integer(), nullable=False, comment="threads.thread_id of the spans."),
        sa.Column("span_id", sa.BigInteger(), nullable=False, comment="span_rows.span_id of the thread's first span in the step (after a span of another step, or none)."),
        sa.Column("step", sa.Integer(), nullable=False, comment="step_rows.step of this span and of the thread's spans after it up to its next row."),
        sa.Column("nth", sa.Integer(), nullable=False, comment="The row's place among its thread's rows, from 1: a span's step is that of the row whose nth is the count of its thread's rows at or before it."),
        sa.PrimaryKeyConstraint("run_id", "rank", "thread_id", "span_id", name="pk_step_starts"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_step_starts_run"),
        sqlite_with_rowid=False,
        comment="Each span's step under its run's step rule in compact form: where each thread's spans enter another step (modtrace.analysis.steps.step_starts), written with step_rows; the span_steps view reads it.",
    )
    op.create_index("ix_step_starts_nth", "step_starts", ["run_id", "rank", "thread_id", "nth"], unique=True)
    op.execute(_FILL_STEP_ROWS)
    op.execute(_FILL_STEP_STARTS)
    op.execute("DROP VIEW IF EXISTS steps")
    op.execute("DROP VIEW IF EXISTS span_steps")
    op.execute(_SPAN_STEPS)
    op.execute(_STEPS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS steps")
    op.execute("DROP VIEW IF EXISTS span_steps")
    op.drop_index("ix_step_starts_nth", table_name="step_starts")
    op.drop_table("step_starts")
    op.drop_table("step_rows")
    op.execute(_OLD_SPAN_STEPS)
    op.execute(_OLD_STEPS)
