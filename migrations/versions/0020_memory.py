"""memory per module call on counted steps: mem_storages and mem_returns (written by the
recorder), span_memory_rows and step_memory (written by modtrace analyze), and the spans view's
memory columns (kept_mem_bytes, kept_mem_bytes_self, peak_mem_bytes, peak_mem_bytes_self)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# The views are written out here, not imported, so this revision stays as it was released.
_SPANS_BEFORE = """CREATE VIEW spans AS
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
        WHEN s.status = 4 THEN 'no_enter' WHEN s.status = 6 THEN 'attributed' END AS status,
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
        WHEN s.status = 4 THEN 'no_enter' WHEN s.status = 6 THEN 'attributed' END AS status,
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
    sc.unknown_ops_self,
    sm.kept_mem_bytes,
    sm.kept_mem_bytes_self,
    sm.peak_mem_bytes,
    sm.peak_mem_bytes_self
FROM span_rows s
JOIN modules m ON m.run_id = s.run_id AND m.rank = s.rank AND m.module_id = s.module_id
LEFT JOIN devices d ON d.run_id = s.run_id AND d.rank = s.rank AND d.device_id = s.device_id
LEFT JOIN span_device_rows sd ON sd.run_id = s.run_id AND sd.rank = s.rank AND sd.span_id = s.span_id
LEFT JOIN span_counter_rows sc ON sc.run_id = s.run_id AND sc.rank = s.rank AND sc.span_id = s.span_id
LEFT JOIN span_memory_rows sm ON sm.run_id = s.run_id AND sm.rank = s.rank AND sm.span_id = s.span_id
"""


def upgrade() -> None:
    op.create_table(
        "mem_storages",
        sa.Column("run_id", sa.Integer(), nullable=False, comment='The run (runs.id).'),
        sa.Column("rank", sa.Integer(), nullable=False, comment='Rank that recorded the storage.'),
        sa.Column("first_seq", sa.BigInteger(), nullable=False, comment='counted_ranges.first_seq of the counted range the storage was seen in.'),
        sa.Column("sid", sa.BigInteger(), nullable=False, comment="Storage id, unique per (run_id, rank), from the rank's memory counter at its allocation (or first sight): orders the range's allocations and frees (with free_order) at equal seq positions."),
        sa.Column("device", sa.Integer(), nullable=False, comment="devices.device_id of the storage's device."),
        sa.Column("nbytes", sa.BigInteger(), nullable=False, comment='Bytes of the storage (on CUDA rounded up to 512, as the caching allocator allocates).'),
        sa.Column("alloc_seq", sa.BigInteger(), nullable=True, comment='Position of the allocation: it happened after event alloc_seq - 1 and before event alloc_seq; NULL: alive before the range (a baseline storage: parameters, gradients, optimizer state, inputs).'),
        sa.Column("free_seq", sa.BigInteger(), nullable=True, comment='Position of the free, as alloc_seq; NULL: still alive when the range ended.'),
        sa.Column("free_order", sa.BigInteger(), nullable=True, comment="The rank's memory counter at the free (sid's counter): orders it among the allocations and frees at the same position; NULL when not freed."),
        sa.Column("call_id", sa.BigInteger(), nullable=False, comment='events.call_id of the innermost module call open at the allocation (as call_counters charge ops); 0: none, or a baseline storage.'),
        sa.Column("phase", sa.SmallInteger(), nullable=False, comment='0 forward, 1 backward, 2 recompute, 3 backward_call (modtrace.core.codes.Phase) of that call.'),
        sa.Column("graph_task", sa.BigInteger(), nullable=False, comment='Autograd graph task of that call; -1 in forward.'),
        sa.PrimaryKeyConstraint("run_id", "rank", "first_seq", "sid", name="pk_mem_storages"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_mem_storages_run"),
        sqlite_with_rowid=False,
        comment='Tensor storages seen on counted steps: each allocation (and free) with the module call it happened in, and the storages alive before; written by the recorder at the end of the recording.',
    )
    op.create_table(
        "mem_returns",
        sa.Column("run_id", sa.Integer(), nullable=False, comment='The run (runs.id).'),
        sa.Column("rank", sa.Integer(), nullable=False, comment='Rank that recorded the call.'),
        sa.Column("call_id", sa.BigInteger(), nullable=False, comment='events.call_id of a forward module call of a counted range.'),
        sa.Column("sid", sa.BigInteger(), nullable=False, comment='mem_storages.sid of a storage of a tensor the call returned.'),
        sa.PrimaryKeyConstraint("run_id", "rank", "call_id", "sid", name="pk_mem_returns"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_mem_returns_run"),
        sqlite_with_rowid=False,
        comment='The storages each forward call of a counted step returned (what a module checkpointed without reentrancy still keeps); written by the recorder at the end of the recording.',
    )
    op.create_table(
        "span_memory_rows",
        sa.Column("run_id", sa.Integer(), nullable=False, comment='The run (runs.id).'),
        sa.Column("rank", sa.Integer(), nullable=False, comment='Rank that recorded the span.'),
        sa.Column("span_id", sa.BigInteger(), nullable=False, comment='span_rows.span_id of the span.'),
        sa.Column("kept_mem_bytes", sa.BigInteger(), nullable=True, comment="Bytes allocated on the span's device by the span and its descendants and still alive at its exit; NULL when never exited."),
        sa.Column("kept_mem_bytes_self", sa.BigInteger(), nullable=True, comment='Of those, bytes allocated while the span itself was the innermost call.'),
        sa.Column("peak_mem_bytes", sa.BigInteger(), nullable=True, comment="The most live tensor bytes on the span's device during the span above the level at its enter (>= 0)."),
        sa.Column("peak_mem_bytes_self", sa.BigInteger(), nullable=True, comment="The most live bytes above the level at its enter reached at allocations of the span's own (>= 0)."),
        sa.PrimaryKeyConstraint("run_id", "rank", "span_id", name="pk_span_memory_rows"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_span_memory_rows_run"),
        sqlite_with_rowid=False,
        comment='Kept and peak memory of the spans of counted steps, written by modtrace analyze from mem_storages; query them through spans.',
    )
    op.create_table(
        "step_memory",
        sa.Column("run_id", sa.Integer(), nullable=False, comment='The run (runs.id).'),
        sa.Column("rank", sa.Integer(), nullable=False, comment='Rank that recorded the step.'),
        sa.Column("first_seq", sa.BigInteger(), nullable=False, comment='counted_ranges.first_seq of the counted range.'),
        sa.Column("step", sa.Integer(), nullable=True, comment="The step the range began in, under the run's step rule (span_steps.step of the span at first_seq); NULL when unknown."),
        sa.Column("device", sa.String(64), nullable=False, comment='Device as torch prints it (devices.name).'),
        sa.Column("base_bytes", sa.BigInteger(), nullable=False, comment="Live tensor bytes on the device at the range's start that the range saw (parameters, gradients, optimizer state, inputs)."),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=False, comment='The most live tensor bytes on the device during the range, base_bytes included.'),
        sa.PrimaryKeyConstraint("run_id", "rank", "first_seq", "device", name="pk_step_memory"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_step_memory_run"),
        sqlite_with_rowid=False,
        comment='Base and peak live tensor memory of each counted step per device, written by modtrace analyze from mem_storages.',
    )
    op.execute("DROP VIEW IF EXISTS spans")
    op.execute(_SPANS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS spans")
    op.execute(_SPANS_BEFORE)
    op.drop_table("step_memory")
    op.drop_table("span_memory_rows")
    op.drop_table("mem_returns")
    op.drop_table("mem_storages")
