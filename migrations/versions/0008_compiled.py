"""compiled modules and unlinked recomputes: modules.compiled (the module ran
compiled, so its inner module calls are not recorded); event status 5 unlinked
(a recompute with no forward call to link to) in event_log; nesting issue
kinds unlinked_recompute and compiled

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 11:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_COMPILED = ("1 when the module was seen running compiled (torch.compile): the module calls inside it are not"
             " recorded; 0 otherwise.")
_OLD_STATUS = "0 ok, 1 error, 2 early_stop, 3 closed_at_end_of_backward, 4 no_enter (modtrace.core.codes.Status)."
_STATUS = _OLD_STATUS.replace("4 no_enter", "4 no_enter, 5 unlinked")
_OLD_KIND = ("no_enter | unclosed | crossed | reentered | duplicate_enter | duplicate_exit | error_exit | early_stop"
             " | closed_at_end_of_backward | invalid_row | time_reversed | seq_gap.")
_KIND = _OLD_KIND.replace("closed_at_end_of_backward", "closed_at_end_of_backward | unlinked_recompute | compiled")

# The view is written out here, not imported, so this revision stays as it was released
# (revision 0005's, with the new status).
_EVENT_LOG = """
CREATE VIEW event_log AS
SELECT
    e.run_id,
    e.seq,
    e.ts_ns,
    CASE e.kind WHEN 0 THEN 'enter' WHEN 1 THEN 'exit' END AS kind,
    m.fqn,
    m.module_type,
    CASE e.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute' END AS phase,
    e.call_id,
    e.step,
    e.rank,
    e.thread_id,
    d.name AS device,
    e.stream,
    CASE e.status WHEN 0 THEN 'ok' WHEN 1 THEN 'error' WHEN 2 THEN 'early_stop'
        WHEN 3 THEN 'closed_at_end_of_backward' WHEN 4 THEN 'no_enter'{unlinked} END AS status,
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


def _comments(status: str, kind: str) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return  # SQLite keeps no comments
    op.alter_column("events", "status", existing_type=sa.SmallInteger(), existing_nullable=False,
                    existing_server_default=sa.text("0"), comment=status)
    op.alter_column("nesting_issues", "kind", existing_type=sa.String(32), existing_nullable=False, comment=kind)


def upgrade() -> None:
    op.add_column("modules", sa.Column("compiled", sa.SmallInteger(), server_default="0", nullable=False,
                                       comment=_COMPILED))
    op.execute("DROP VIEW IF EXISTS event_log")
    op.execute(_EVENT_LOG.format(unlinked=" WHEN 5 THEN 'unlinked'"))
    _comments(_STATUS, _KIND)


def downgrade() -> None:
    op.execute("DELETE FROM nesting_issues WHERE kind IN ('unlinked_recompute', 'compiled')")
    _comments(_OLD_STATUS, _OLD_KIND)
    op.execute("DROP VIEW IF EXISTS event_log")
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+) with the view gone: nothing reads modules.compiled.
    op.drop_column("modules", "compiled")
    op.execute(_EVENT_LOG.format(unlinked=""))
