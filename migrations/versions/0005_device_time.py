"""device time and memory: device_events, span_device_rows; event_log and spans join them (issue 16)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 11:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Views written out here, not imported, so this revision stays as released.
# Each is the previous revision's with the device columns at the end.
EVENT_LOG_BEFORE = """
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
        WHEN 3 THEN 'closed_at_end_of_backward' WHEN 4 THEN 'no_enter' END AS status,
    e.graph_task,
    e.tie,
    e.module_id,
    r.wall_anchor_ns + e.ts_ns AS wall_ns
FROM events e
JOIN modules m ON m.run_id = e.run_id AND m.rank = e.rank AND m.module_id = e.module_id
JOIN run_ranks r ON r.run_id = e.run_id AND r.rank = e.rank
LEFT JOIN devices d ON d.run_id = e.run_id AND d.rank = e.rank AND d.device_id = e.device_id
"""

EVENT_LOG = """
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
        WHEN 3 THEN 'closed_at_end_of_backward' WHEN 4 THEN 'no_enter' END AS status,
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

SPANS_BEFORE = """
CREATE VIEW spans AS
SELECT
    s.run_id,
    s.rank,
    s.span_id,
    s.parent_span_id,
    s.depth,
    m.fqn,
    m.module_type,
    CASE s.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute' END AS phase,
    s.call_id,
    s.step,
    s.thread_id,
    s.start_ns,
    s.end_ns,
    s.duration_ns,
    s.self_ns,
    d.name AS device,
    s.stream,
    CASE WHEN s.status IS NULL THEN 'unclosed' WHEN s.status = 0 THEN 'ok' WHEN s.status = 1 THEN 'error'
        WHEN s.status = 2 THEN 'early_stop' WHEN s.status = 3 THEN 'closed_at_end_of_backward'
        WHEN s.status = 4 THEN 'no_enter' END AS status,
    s.graph_task,
    s.exit_seq,
    s.module_id
FROM span_rows s
JOIN modules m ON m.run_id = s.run_id AND m.rank = s.rank AND m.module_id = s.module_id
LEFT JOIN devices d ON d.run_id = s.run_id AND d.rank = s.rank AND d.device_id = s.device_id
"""

SPANS = """
CREATE VIEW spans AS
SELECT
    s.run_id,
    s.rank,
    s.span_id,
    s.parent_span_id,
    s.depth,
    m.fqn,
    m.module_type,
    CASE s.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute' END AS phase,
    s.call_id,
    s.step,
    s.thread_id,
    s.start_ns,
    s.end_ns,
    s.duration_ns,
    s.self_ns,
    d.name AS device,
    s.stream,
    CASE WHEN s.status IS NULL THEN 'unclosed' WHEN s.status = 0 THEN 'ok' WHEN s.status = 1 THEN 'error'
        WHEN s.status = 2 THEN 'early_stop' WHEN s.status = 3 THEN 'closed_at_end_of_backward'
        WHEN s.status = 4 THEN 'no_enter' END AS status,
    s.graph_task,
    s.exit_seq,
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

_NS = "Nanoseconds on the rank's clock"


def upgrade() -> None:
    op.create_table(
        "device_events",
        sa.Column("run_id", sa.Integer(), nullable=False, comment="The run (runs.id)."),
        sa.Column("rank", sa.Integer(), nullable=False, comment="Rank that recorded the event."),
        sa.Column("seq", sa.BigInteger(), nullable=False, comment="events.seq of the enter or exit event."),
        sa.Column("device_ts_ns", sa.BigInteger(), nullable=True, comment="Nanoseconds on the rank's clock when the device reached the event: the host time at which the device's reference event was recorded plus the device's elapsed time since it. NULL when the device could not time it."),
        sa.Column("mem_bytes", sa.BigInteger(), nullable=True, comment="Bytes allocated by tensors on the event's device at the event (torch.cuda.memory_allocated, read on the host). NULL when not read."),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_device_events_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_device_events"),
        comment="Device time and allocated memory of the events of module calls on CUDA devices, written as their device events resolve; query them through event_log.",
        sqlite_with_rowid=False,
    )
    op.create_table(
        "span_device_rows",
        sa.Column("run_id", sa.Integer(), nullable=False, comment="The run (runs.id)."),
        sa.Column("rank", sa.Integer(), nullable=False, comment="Rank that recorded the span."),
        sa.Column("span_id", sa.BigInteger(), nullable=False, comment="span_rows.span_id of the span."),
        sa.Column("device_start_ns", sa.BigInteger(), nullable=True, comment="device_ts_ns of the enter event, in nanoseconds on the rank's clock."),
        sa.Column("device_end_ns", sa.BigInteger(), nullable=True, comment="device_ts_ns of the exit event, in nanoseconds on the rank's clock."),
        sa.Column("device_duration_ns", sa.BigInteger(), nullable=True, comment="Device nanoseconds from the enter to the exit, idle gaps of the stream included."),
        sa.Column("device_self_ns", sa.BigInteger(), nullable=True, comment="device_duration_ns minus the device durations of children on the same device and stream; NULL when such a child has no device time."),
        sa.Column("mem_delta_bytes", sa.BigInteger(), nullable=True, comment="Allocated bytes on the span's device at the exit minus at the enter."),
        sa.Column("mem_max_bytes", sa.BigInteger(), nullable=True, comment="The most allocated on the span's device at any event of the span or its descendants."),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_span_device_rows_run", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank", "span_id", name="pk_span_device_rows"),
        comment="Device time and memory of spans, written by modtrace analyze for runs with device times; query them through spans.",
        sqlite_with_rowid=False,
    )
    op.execute("DROP VIEW IF EXISTS event_log")
    op.execute(EVENT_LOG)
    op.execute("DROP VIEW IF EXISTS spans")
    op.execute(SPANS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS spans")
    op.execute(SPANS_BEFORE)
    op.execute("DROP VIEW IF EXISTS event_log")
    op.execute(EVENT_LOG_BEFORE)
    op.drop_table("span_device_rows")
    op.drop_table("device_events")
