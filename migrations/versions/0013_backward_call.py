"""phase 3 backward_call: a module called by backward code other than checkpoint
recomputation (a custom autograd Function's backward, a backward hook), a call
of its own; the event_log and spans views name it, the phase columns' comments
list it

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_PHASE_CODES = "0 forward, 1 backward, 2 recompute (modtrace.core.codes.Phase)."
_PHASE_NAMES = "forward | backward | recompute"
# (table, column, type, nullable, comment before, comment after)
_COMMENTS = (
    ("events", "phase", sa.SmallInteger(), False, _PHASE_CODES, _PHASE_CODES.replace("2 recompute", "2 recompute, 3 backward_call")),
    ("events", "call_id", sa.BigInteger(), False,
     "One per forward module call; its backward and recompute events carry the same id.",
     "One per forward or backward_call module call; its backward and recompute events carry the same id."),
    ("events", "graph_task", sa.BigInteger(), True,
     "Autograd graph task id for backward and recompute events; NULL in forward.",
     "Autograd graph task id for backward, recompute and backward_call events; NULL in forward."),
    ("span_rows", "phase", sa.SmallInteger(), False, _PHASE_CODES, _PHASE_CODES.replace("2 recompute", "2 recompute, 3 backward_call")),
    ("span_rows", "graph_task", sa.BigInteger(), True,
     "Autograd graph task of a backward or recompute span; NULL in forward.",
     "Autograd graph task of a backward, recompute or backward_call span; NULL in forward."),
    ("span_rows", "parent_gap", sa.BigInteger(), True,
     "span_id minus the span_id of the enclosing span on the same stack (the spans view's parent_span_id); NULL at a"
     " root. A recompute span's parent is the backward span open on its thread when it ran.",
     "span_id minus the span_id of the enclosing span on the same stack (the spans view's parent_span_id); NULL at a"
     " root. A recompute or backward_call span's parent is the backward span open on its thread when it ran."),
    ("nesting_issues", "phase", sa.String(16), True,
     f"{_PHASE_NAMES}; NULL for an invalid_row whose phase code is unknown.",
     f"{_PHASE_NAMES} | backward_call; NULL for an invalid_row whose phase code is unknown."),
    ("tree_nodes", "phase", sa.String(16), False, f"{_PHASE_NAMES}.", f"{_PHASE_NAMES} | backward_call."),
)

# The views are written out here, not imported, so this revision stays as it was released
# (revision 0010's, with the new phase).
_EVENT_LOG = """
CREATE VIEW event_log AS
SELECT
    e.run_id,
    e.seq,
    e.ts_ns,
    CASE e.kind WHEN 0 THEN 'enter' WHEN 1 THEN 'exit' END AS kind,
    m.fqn,
    m.module_type,
    CASE e.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute'{backward_call} END AS phase,
    e.call_id,
    e.step,
    e.rank,
    e.thread_id,
    d.name AS device,
    e.stream,
    CASE e.status WHEN 0 THEN 'ok' WHEN 1 THEN 'error' WHEN 2 THEN 'early_stop'
        WHEN 3 THEN 'closed_at_end_of_backward' WHEN 4 THEN 'no_enter' WHEN 5 THEN 'unlinked' END AS status,
    e.graph_task,
    e.tie,
    e.module_id,
    r.wall_anchor_ns + e.ts_ns AS wall_ns,
    de.device_ts_ns,
    de.mem_bytes
FROM events e
JOIN modules m ON m.run_id = e.run_id AND m.rank = e.rank AND m.module_id = e.module_id
JOIN run_ranks r ON r.run_id = e.run_id AND r.rank = e.rank
LEFT JOIN devices d ON d.run_id = e.run_id AND d.rank = e.rank AND d.device_id = e.device_id
LEFT JOIN device_events de ON de.run_id = e.run_id AND de.rank = e.rank AND de.seq = e.seq
"""

_SPANS = """
CREATE VIEW spans AS
SELECT
    s.run_id,
    s.rank,
    s.span_id,
    s.span_id - s.parent_gap AS parent_span_id,
    s.depth,
    m.fqn,
    m.module_type,
    CASE s.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute'{backward_call} END AS phase,
    s.call_id,
    s.step,
    s.thread_id,
    s.start_ns,
    s.start_ns + s.duration_ns AS end_ns,
    s.duration_ns,
    s.self_ns,
    d.name AS device,
    s.stream,
    CASE WHEN s.status IS NULL THEN 'unclosed' WHEN s.status = 0 THEN 'ok' WHEN s.status = 1 THEN 'error'
        WHEN s.status = 2 THEN 'early_stop' WHEN s.status = 3 THEN 'closed_at_end_of_backward'
        WHEN s.status = 4 THEN 'no_enter' END AS status,
    s.graph_task,
    s.span_id + s.exit_gap AS exit_seq,
    s.module_id,
    sd.device_start_ns,
    sd.device_end_ns,
    sd.device_duration_ns,
    sd.device_self_ns,
    sd.mem_delta_bytes,
    sd.mem_max_bytes
FROM span_rows s
JOIN modules m ON m.run_id = s.run_id AND m.rank = s.rank AND m.module_id = s.module_id
LEFT JOIN devices d ON d.run_id = s.run_id AND d.rank = s.rank AND d.device_id = s.device_id
LEFT JOIN span_device_rows sd ON sd.run_id = s.run_id AND sd.rank = s.rank AND sd.span_id = s.span_id
"""


# The steps view of revision 0011 with backward_call counted as backward work.
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


def _views(backward_call: str) -> None:
    op.execute("DROP VIEW IF EXISTS event_log")
    op.execute("DROP VIEW IF EXISTS spans")
    op.execute(_EVENT_LOG.format(backward_call=backward_call))
    op.execute(_SPANS.format(backward_call=backward_call))


def _comments(after: bool) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return  # SQLite keeps no comments
    for table, column, type_, nullable, before, new in _COMMENTS:
        op.alter_column(table, column, existing_type=type_, existing_nullable=nullable, comment=new if after else before)


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS steps")
    op.execute(_STEPS)
    _views(" WHEN 3 THEN 'backward_call'")
    _comments(after=True)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS steps")
    op.execute(_STEPS.replace("phase IN (1, 3) THEN", "phase = 1 THEN"))
    _comments(after=False)
    _views("")
