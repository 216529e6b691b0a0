"""spans and nesting issues: span_rows, nesting_issues, spans view

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 19:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# Written out here, not imported, so this revision stays as released.
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
    s.module_id
FROM span_rows s
JOIN modules m ON m.run_id = s.run_id AND m.rank = s.rank AND m.module_id = s.module_id
LEFT JOIN devices d ON d.run_id = s.run_id AND d.rank = s.rank AND d.device_id = s.device_id
"""

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('span_rows',
    sa.Column('run_id', sa.Integer(), nullable=False, comment='The run (runs.id).'),
    sa.Column('rank', sa.Integer(), nullable=False, comment='Rank that recorded the span.'),
    sa.Column('span_id', sa.BigInteger(), nullable=False, comment='Span id: the seq of its enter event, unique per (run_id, rank).'),
    sa.Column('parent_span_id', sa.BigInteger(), nullable=True, comment="span_id of the enclosing span on the same stack; NULL at a root. A recompute span's parent is the backward span open on its thread when it ran."),
    sa.Column('depth', sa.Integer(), nullable=False, comment='Nesting depth on its stack, 0 at a root.'),
    sa.Column('module_id', sa.Integer(), nullable=False, comment='modules.module_id of the module called.'),
    sa.Column('phase', sa.SmallInteger(), nullable=False, comment='0 forward, 1 backward, 2 recompute (modtrace.core.codes.Phase).'),
    sa.Column('call_id', sa.BigInteger(), nullable=False, comment='The forward call this span belongs to (events.call_id).'),
    sa.Column('step', sa.Integer(), nullable=False, comment="Step at the span's enter."),
    sa.Column('thread_id', sa.Integer(), nullable=False, comment='threads.thread_id of the thread the span ran on.'),
    sa.Column('graph_task', sa.BigInteger(), nullable=True, comment='Autograd graph task of a backward or recompute span; NULL in forward.'),
    sa.Column('start_ns', sa.BigInteger(), nullable=False, comment='ts_ns of the enter event.'),
    sa.Column('end_ns', sa.BigInteger(), nullable=True, comment='ts_ns of the exit event; NULL when the span was never exited.'),
    sa.Column('duration_ns', sa.BigInteger(), nullable=True, comment='end_ns - start_ns (inclusive time); NULL when never exited.'),
    sa.Column('self_ns', sa.BigInteger(), nullable=True, comment='duration_ns minus the durations of its child spans (exclusive time); NULL when never exited.'),
    sa.Column('device_id', sa.Integer(), nullable=True, comment='devices.device_id at the enter; NULL when unknown.'),
    sa.Column('stream', sa.BigInteger(), nullable=True, comment='Accelerator stream at the enter; NULL on CPU.'),
    sa.Column('status', sa.SmallInteger(), nullable=True, comment='Status of the exit event (modtrace.core.codes.Status); NULL when the span was never exited (shown as unclosed in the spans view).'),
    sa.Column('exit_seq', sa.BigInteger(), nullable=True, comment='seq of the exit event; NULL when never exited.'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_span_rows_run', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'rank', 'span_id', name='pk_span_rows'),
    comment='Spans rebuilt from events by modtrace analyze (one per module call and phase), in compact form; query the spans view for readable values.',
    sqlite_with_rowid=False
    )
    op.create_index('ix_span_rows_module', 'span_rows', ['run_id', 'rank', 'module_id', 'phase'], unique=False)
    op.create_table('nesting_issues',
    sa.Column('run_id', sa.Integer(), nullable=False, comment='The run (runs.id).'),
    sa.Column('rank', sa.Integer(), nullable=False, comment='Rank whose events show the issue.'),
    sa.Column('seq', sa.BigInteger(), nullable=False, comment='seq of the event the issue is about.'),
    sa.Column('kind', sa.String(length=32), nullable=False, comment='no_enter | unclosed | crossed | reentered | duplicate_enter | duplicate_exit | error_exit | early_stop | closed_at_end_of_backward.'),
    sa.Column('severity', sa.String(length=8), nullable=False, comment='error | warning | info. A healthy record has no error or warning.'),
    sa.Column('fqn', sa.Text(), nullable=True, comment='Fully qualified name of the module of that event.'),
    sa.Column('phase', sa.String(length=16), nullable=False, comment='forward | backward | recompute.'),
    sa.Column('call_id', sa.BigInteger(), nullable=False, comment='events.call_id of that event.'),
    sa.Column('step', sa.Integer(), nullable=True, comment='Step of that event.'),
    sa.Column('thread_id', sa.Integer(), nullable=True, comment='threads.thread_id of that event.'),
    sa.Column('message', sa.Text(), nullable=False, comment='What happened, naming the module, phase, step and the events involved.'),
    sa.CheckConstraint("severity IN ('error', 'warning', 'info')", name='ck_nesting_issues_severity'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_nesting_issues_run', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'rank', 'seq', 'kind', name='pk_nesting_issues'),
    comment='Nesting problems found by modtrace analyze: events that do not form a proper hierarchy, and unusual closes.'
    )
    op.execute(SPANS)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS spans")
    op.drop_table('nesting_issues')
    op.drop_index('ix_span_rows_module', table_name='span_rows')
    op.drop_table('span_rows')
