"""status 6 attributed: a module call inside torch.compile'd code, whose time is attributed
from the kernels inductor generated for it (not measured by hooks); the event_log and spans
views name it, the status columns' comments list it, and tree_nodes.source tells a node
measured by hooks from one attributed from kernels

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_EVENT_STATUS = "0 ok, 1 error, 2 early_stop, 3 closed_at_end_of_backward, 4 no_enter, 5 unlinked (modtrace.core.codes.Status)."
_SPAN_STATUS = ("Status of the exit event (modtrace.core.codes.Status); NULL when the span was never exited (shown as"
                " unclosed in the spans view).")
# (table, column, type, nullable, comment before, comment after)
_COMMENTS = (
    ("events", "status", sa.SmallInteger(), False, _EVENT_STATUS, _EVENT_STATUS.replace(
        "5 unlinked (modtrace.core.codes.Status).",
        "5 unlinked, 6 attributed (a call inside compiled code, its time attributed from the kernels inductor"
        " generated for it; modtrace.core.codes.Status).")),
    ("span_rows", "status", sa.SmallInteger(), True, _SPAN_STATUS,
     _SPAN_STATUS + " 6 attributed: a call inside compiled code, timed by the kernels inductor generated for it, not by hooks."),
)
_TREE_SOURCE = ("hooks | kernels | mixed: whether the node's spans were measured by module hooks, attributed from"
                " compiled kernels (status attributed), or some of each.")

# The views are written out here, not imported, so this revision stays as it was released
# (revision 0015's spans and revision 0013's event_log, with the new status).
_EVENT_LOG = """
CREATE VIEW event_log AS
SELECT
    e.run_id,
    e.seq,
    e.ts_ns,
    CASE e.kind WHEN 0 THEN 'enter' WHEN 1 THEN 'exit' END AS kind,
    m.fqn,
    m.module_type,
    CASE e.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute' WHEN 3 THEN 'backward_call' END AS phase,
    e.call_id,
    e.step,
    e.rank,
    e.thread_id,
    d.name AS device,
    e.stream,
    CASE e.status WHEN 0 THEN 'ok' WHEN 1 THEN 'error' WHEN 2 THEN 'early_stop'
        WHEN 3 THEN 'closed_at_end_of_backward' WHEN 4 THEN 'no_enter' WHEN 5 THEN 'unlinked'{attributed} END AS status,
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
    CASE s.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute' WHEN 3 THEN 'backward_call' END AS phase,
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
        WHEN s.status = 4 THEN 'no_enter'{attributed} END AS status,
    s.graph_task,
    s.span_id + s.exit_gap AS exit_seq,
    s.module_id,
    sd.device_start_ns,
    sd.device_end_ns,
    sd.device_duration_ns,
    sd.device_self_ns,
    sd.mem_delta_bytes,
    sd.mem_max_bytes,
    sc.flops,
    sc.flops_self,
    sc.bytes,
    sc.bytes_self,
    sc.ops,
    sc.ops_self,
    sc.unknown_ops,
    sc.unknown_ops_self
FROM span_rows s
JOIN modules m ON m.run_id = s.run_id AND m.rank = s.rank AND m.module_id = s.module_id
LEFT JOIN devices d ON d.run_id = s.run_id AND d.rank = s.rank AND d.device_id = s.device_id
LEFT JOIN span_device_rows sd ON sd.run_id = s.run_id AND sd.rank = s.rank AND sd.span_id = s.span_id
LEFT JOIN span_counter_rows sc ON sc.run_id = s.run_id AND sc.rank = s.rank AND sc.span_id = s.span_id
"""


def _views(event_log: str, spans: str) -> None:
    op.execute("DROP VIEW IF EXISTS event_log")
    op.execute("DROP VIEW IF EXISTS spans")
    op.execute(_EVENT_LOG.format(attributed=event_log))
    op.execute(_SPANS.format(attributed=spans))


def _comments(after: bool) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return  # SQLite keeps no comments
    for table, column, type_, nullable, before, new in _COMMENTS:
        op.alter_column(table, column, existing_type=type_, existing_nullable=nullable, comment=new if after else before)


def upgrade() -> None:
    _views(" WHEN 6 THEN 'attributed'", " WHEN s.status = 6 THEN 'attributed'")
    _comments(after=True)
    # Every stored node so far was measured by hooks: nothing was attributed before this revision.
    op.add_column("tree_nodes", sa.Column("source", sa.String(8), nullable=False, server_default="hooks", comment=_TREE_SOURCE))


def downgrade() -> None:
    op.drop_column("tree_nodes", "source")
    _comments(after=False)
    _views("", "")
