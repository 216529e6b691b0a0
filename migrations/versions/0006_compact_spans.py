"""compact spans: span_rows keeps no end_ns (the spans view computes it), its parent
and exit as small gaps from span_id, and no second index

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 11:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Written out here, not imported, so this revision stays as released.  The
# columns and their order are those of revision 0005's view (0002's, then the device columns).
_SPANS = """
CREATE VIEW spans AS
SELECT
    s.run_id,
    s.rank,
    s.span_id,
    {parent} AS parent_span_id,
    s.depth,
    m.fqn,
    m.module_type,
    CASE s.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute' END AS phase,
    s.call_id,
    s.step,
    s.thread_id,
    s.start_ns,
    {end_ns} AS end_ns,
    s.duration_ns,
    s.self_ns,
    d.name AS device,
    s.stream,
    CASE WHEN s.status IS NULL THEN 'unclosed' WHEN s.status = 0 THEN 'ok' WHEN s.status = 1 THEN 'error'
        WHEN s.status = 2 THEN 'early_stop' WHEN s.status = 3 THEN 'closed_at_end_of_backward'
        WHEN s.status = 4 THEN 'no_enter' END AS status,
    s.graph_task,
    {exit_seq} AS exit_seq,
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


_PARENT = ("span_id of the enclosing span on the same stack; NULL at a root. A recompute span's parent is the "
           "backward span open on its thread when it ran.")
_EXIT_SEQ = "seq of the exit event; NULL when never exited."
_PARENT_GAP = ("span_id minus the span_id of the enclosing span on the same stack (the spans view's parent_span_id); "
               "NULL at a root. A recompute span's parent is the backward span open on its thread when it ran.")
_EXIT_GAP = "seq of the exit event minus span_id (the spans view's exit_seq); NULL when never exited."


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS spans")
    op.drop_index("ix_span_rows_module", table_name="span_rows")
    op.add_column("span_rows", sa.Column("parent_gap", sa.BigInteger(), nullable=True, comment=_PARENT_GAP))
    op.add_column("span_rows", sa.Column("exit_gap", sa.BigInteger(), nullable=True, comment=_EXIT_GAP))
    op.execute("UPDATE span_rows SET parent_gap = span_id - parent_span_id, exit_gap = exit_seq - span_id")
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), no batch copy of the table.
    for name in ("end_ns", "parent_span_id", "exit_seq"):
        op.drop_column("span_rows", name)
    op.execute(_SPANS.format(end_ns="s.start_ns + s.duration_ns", parent="s.span_id - s.parent_gap",
                             exit_seq="s.span_id + s.exit_gap"))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS spans")
    op.add_column("span_rows", sa.Column("parent_span_id", sa.BigInteger(), nullable=True, comment=_PARENT))
    op.add_column("span_rows", sa.Column("end_ns", sa.BigInteger(), nullable=True, comment="ts_ns of the exit event; NULL when the span was never exited."))
    op.add_column("span_rows", sa.Column("exit_seq", sa.BigInteger(), nullable=True, comment=_EXIT_SEQ))
    op.execute("UPDATE span_rows SET parent_span_id = span_id - parent_gap, end_ns = start_ns + duration_ns, "
               "exit_seq = span_id + exit_gap")
    for name in ("parent_gap", "exit_gap"):
        op.drop_column("span_rows", name)
    op.create_index("ix_span_rows_module", "span_rows", ["run_id", "rank", "module_id", "phase"], unique=False)
    op.execute(_SPANS.format(end_ns="s.end_ns", parent="s.parent_span_id", exit_seq="s.exit_seq"))
