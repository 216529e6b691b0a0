"""work counters: runs.counters (which steps the recorder counted), call_counters and
counted_ranges (written by the recorder), span_counter_rows (written by modtrace analyze)
and the spans view's counter columns (flops, flops_self, bytes, bytes_self, ops, ops_self,
unknown_ops, unknown_ops_self)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_RUN_COUNTERS = 'Which steps the recorder counted FLOPs, bytes and ops on (Recorder(counters=...), modtrace record --counters): first (the first recorded step of each step kind) | every-step | off; NULL for runs recorded before revision 0015. The counted steps are those whose spans have counters (spans.ops not NULL).'

# The views are written out here, not imported, so this revision stays as it was released.
_SPANS_BEFORE = """
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
        WHEN s.status = 4 THEN 'no_enter' END AS status,
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


def upgrade() -> None:
    op.add_column("runs", sa.Column("counters", sa.String(16), nullable=True, comment=_RUN_COUNTERS))
    op.create_table(
        "call_counters",
        sa.Column("run_id", sa.Integer(), nullable=False, comment='The run (runs.id).'),
        sa.Column("rank", sa.Integer(), nullable=False, comment='Rank that recorded the call.'),
        sa.Column("call_id", sa.BigInteger(), nullable=False, comment='events.call_id of the module call the ops ran in (the innermost open).'),
        sa.Column("phase", sa.SmallInteger(), nullable=False, comment='0 forward, 1 backward, 2 recompute, 3 backward_call (modtrace.core.codes.Phase).'),
        sa.Column("graph_task", sa.BigInteger(), nullable=False, comment='Autograd graph task of a backward, recompute or backward_call; -1 in forward.'),
        sa.Column("flops", sa.BigInteger(), nullable=False, comment="FLOPs of the call's own ops (torch.utils.flop_counter's formulas)."),
        sa.Column("bytes", sa.BigInteger(), nullable=False, comment="Bytes of the tensor inputs and outputs of the call's own ops (views: none)."),
        sa.Column("ops", sa.BigInteger(), nullable=False, comment='Aten ops the call ran itself.'),
        sa.Column("unknown_ops", sa.BigInteger(), nullable=False, comment='Of those, ops with no FLOP formula that may do such work: flops is a lower bound when not 0.'),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_call_counters_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank", "call_id", "phase", "graph_task", name="pk_call_counters"),
        comment="Work counted per module call and phase on counted steps (the ops charged to the innermost open call), written by the recorder at the end of the recording; query the spans view's counter columns.",
        sqlite_with_rowid=False,
    )
    op.create_table(
        "counted_ranges",
        sa.Column("run_id", sa.Integer(), nullable=False, comment='The run (runs.id).'),
        sa.Column("rank", sa.Integer(), nullable=False, comment='Rank that counted.'),
        sa.Column("first_seq", sa.BigInteger(), nullable=False, comment="seq of the first event of the counted range (a root call's enter)."),
        sa.Column("last_seq", sa.BigInteger(), nullable=False, comment='seq of the last event of the counted range: every span entered from first_seq to last_seq has counters.'),
        sa.Column("flops", sa.BigInteger(), nullable=False, comment="FLOPs of the range's ops run outside any module call."),
        sa.Column("bytes", sa.BigInteger(), nullable=False, comment="Bytes of the range's ops run outside any module call."),
        sa.Column("ops", sa.BigInteger(), nullable=False, comment='Aten ops of the range run outside any module call (a loss function, the optimizer).'),
        sa.Column("unknown_ops", sa.BigInteger(), nullable=False, comment='Of those, ops with no FLOP formula that may do such work.'),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_counted_ranges_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank", "first_seq", name="pk_counted_ranges"),
        comment='The event ranges (one per counted step or root call) during which the recorder counted work, written by the recorder at the end of the recording.',
        sqlite_with_rowid=False,
    )
    op.create_table(
        "span_counter_rows",
        sa.Column("run_id", sa.Integer(), nullable=False, comment='The run (runs.id).'),
        sa.Column("rank", sa.Integer(), nullable=False, comment='Rank that recorded the span.'),
        sa.Column("span_id", sa.BigInteger(), nullable=False, comment='span_rows.span_id of the span.'),
        sa.Column("flops", sa.BigInteger(), nullable=False, comment='FLOPs of the span and its descendant spans.'),
        sa.Column("flops_self", sa.BigInteger(), nullable=False, comment="FLOPs of the span's own ops."),
        sa.Column("bytes", sa.BigInteger(), nullable=False, comment='Bytes of the span and its descendant spans.'),
        sa.Column("bytes_self", sa.BigInteger(), nullable=False, comment="Bytes of the span's own ops."),
        sa.Column("ops", sa.BigInteger(), nullable=False, comment='Aten ops of the span and its descendant spans.'),
        sa.Column("ops_self", sa.BigInteger(), nullable=False, comment="Aten ops of the span's own."),
        sa.Column("unknown_ops", sa.BigInteger(), nullable=False, comment='Ops with no FLOP formula in the span and its descendants: flops is a lower bound when not 0.'),
        sa.Column("unknown_ops_self", sa.BigInteger(), nullable=False, comment="Ops with no FLOP formula of the span's own: flops_self is a lower bound when not 0."),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_span_counter_rows_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank", "span_id", name="pk_span_counter_rows"),
        comment='Work counters of the spans of counted steps, inclusive and self, written by modtrace analyze from call_counters; query them through spans.',
        sqlite_with_rowid=False,
    )
    op.execute("DROP VIEW IF EXISTS spans")
    op.execute(_SPANS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS spans")
    op.execute(_SPANS_BEFORE)
    op.drop_table("span_counter_rows")
    op.drop_table("counted_ranges")
    op.drop_table("call_counters")
    op.drop_column("runs", "counters")
