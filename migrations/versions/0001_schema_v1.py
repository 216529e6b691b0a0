"""schema v1: runs, ranks, modules, threads, devices, events, event_log view

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 17:03:37.349779
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# The view is written out here, not imported, so this revision stays as it
# was released whatever later code does.
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
    r.wall_anchor_ns + e.ts_ns AS wall_ns
FROM events e
JOIN modules m ON m.run_id = e.run_id AND m.rank = e.rank AND m.module_id = e.module_id
JOIN run_ranks r ON r.run_id = e.run_id AND r.rank = e.rank
LEFT JOIN devices d ON d.run_id = e.run_id AND d.rank = e.rank AND d.device_id = e.device_id
"""


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('runs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False, comment='Run id, unique in this database.'),
    sa.Column('name', sa.String(length=200), nullable=False, comment='Run name, unique in this database; shared by the ranks of one distributed launch.'),
    sa.Column('status', sa.String(length=16), nullable=False, comment="running | completed | failed | interrupted. A run left 'running' by a killed process is shown as incomplete."),
    sa.Column('started_at', sa.String(length=32), nullable=False, comment='UTC start time, ISO 8601 (YYYY-MM-DDTHH:MM:SS.ffffffZ).'),
    sa.Column('ended_at', sa.String(length=32), nullable=True, comment='UTC end time, ISO 8601; NULL while running or after a crash.'),
    sa.Column('command', sa.Text(), nullable=True, comment='Full command line that produced the run.'),
    sa.Column('cwd', sa.Text(), nullable=True, comment='Working directory of the recording process.'),
    sa.Column('hostname', sa.String(length=255), nullable=True, comment='Host of the process that created the run (rank 0 or the first rank to start).'),
    sa.Column('pid', sa.Integer(), nullable=True, comment='Process id of the process that created the run.'),
    sa.Column('git_commit', sa.String(length=64), nullable=True, comment='Git commit of the working directory, when it is a repository.'),
    sa.Column('world_size', sa.Integer(), server_default='1', nullable=False, comment='Number of ranks in the launch (torch.distributed world size or WORLD_SIZE, else 1).'),
    sa.Column('python_version', sa.String(length=32), nullable=True, comment='Python version of the recording process.'),
    sa.Column('torch_version', sa.String(length=64), nullable=True, comment='torch.__version__ of the recording process.'),
    sa.Column('modtrace_version', sa.String(length=32), nullable=True, comment='modtrace version that recorded the run.'),
    sa.Column('tags', sa.Text(), server_default='{}', nullable=False, comment='User tags as a JSON object of strings.'),
    sa.Column('error', sa.Text(), nullable=True, comment='Summary of the exception or signal that ended a failed or interrupted run.'),
    sa.CheckConstraint("status IN ('running', 'completed', 'failed', 'interrupted')", name='ck_runs_status'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name', name='uq_runs_name'),
    comment='One row per recorded run (one training or inference job, possibly many ranks).'
    )
    op.create_table('devices',
    sa.Column('run_id', sa.Integer(), nullable=False, comment='The run (runs.id).'),
    sa.Column('rank', sa.Integer(), nullable=False, comment='Rank of the process.'),
    sa.Column('device_id', sa.Integer(), nullable=False, comment='Small device number within (run_id, rank).'),
    sa.Column('name', sa.String(length=64), nullable=False, comment='Device as torch prints it: cpu, cuda:0, meta, ...'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_devices_run', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'rank', 'device_id', name='pk_devices'),
    comment='Devices that module calls computed on.'
    )
    op.create_table('events',
    sa.Column('run_id', sa.Integer(), nullable=False, comment='The run (runs.id).'),
    sa.Column('rank', sa.Integer(), nullable=False, comment='Rank that recorded the event.'),
    sa.Column('seq', sa.BigInteger(), nullable=False, comment='Event number, strictly increasing per (run_id, rank).'),
    sa.Column('ts_ns', sa.BigInteger(), nullable=False, comment='Monotonic nanoseconds since the rank started recording (run_ranks.wall_anchor_ns is ts_ns = 0).'),
    sa.Column('kind', sa.SmallInteger(), nullable=False, comment='0 enter, 1 exit (modtrace.core.codes.Kind).'),
    sa.Column('module_id', sa.Integer(), nullable=False, comment='modules.module_id of the module.'),
    sa.Column('phase', sa.SmallInteger(), nullable=False, comment='0 forward, 1 backward, 2 recompute (modtrace.core.codes.Phase).'),
    sa.Column('call_id', sa.BigInteger(), nullable=False, comment='One per forward module call; its backward and recompute events carry the same id.'),
    sa.Column('step', sa.Integer(), nullable=False, comment='Step number, from 0; advanced by Recorder.step() and after each optimizer step.'),
    sa.Column('thread_id', sa.Integer(), nullable=False, comment='threads.thread_id of the thread the hook ran on.'),
    sa.Column('device_id', sa.Integer(), nullable=True, comment='devices.device_id where the call computes; NULL when it has no tensor input, parameter or buffer.'),
    sa.Column('stream', sa.BigInteger(), nullable=True, comment='Current CUDA/accelerator stream handle on that device; NULL on CPU.'),
    sa.Column('status', sa.SmallInteger(), server_default='0', nullable=False, comment='0 ok, 1 error, 2 early_stop, 3 closed_at_end_of_backward, 4 no_enter (modtrace.core.codes.Status).'),
    sa.Column('graph_task', sa.BigInteger(), nullable=True, comment='Autograd graph task id for backward and recompute events; NULL in forward.'),
    sa.Column('tie', sa.SmallInteger(), server_default='0', nullable=False, comment='1 when produced by the same autograd hook dispatch as the previous event of this thread (a tie to normalise), else 0.'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_events_run', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'rank', 'seq', name='pk_events'),
    comment='Raw enter/exit events in compact form; query the event_log view for readable values.',
    sqlite_with_rowid=False
    )
    op.create_table('modules',
    sa.Column('run_id', sa.Integer(), nullable=False, comment='The run (runs.id).'),
    sa.Column('rank', sa.Integer(), nullable=False, comment='Rank that named the module; ids are per rank.'),
    sa.Column('module_id', sa.Integer(), nullable=False, comment='Module id within (run_id, rank).'),
    sa.Column('fqn', sa.Text(), nullable=False, comment='Fully qualified name: root class name then attribute path, e.g. GPT.blocks.0.attn.'),
    sa.Column('module_type', sa.String(length=200), nullable=False, comment='Class name of the module, e.g. Linear.'),
    sa.Column('parent_module_id', sa.Integer(), nullable=True, comment='module_id of the owning module; NULL for a root.'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_modules_run', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'rank', 'module_id', name='pk_modules'),
    comment='Every nn.Module a run saw, with its place in the module tree.'
    )
    op.create_table('run_ranks',
    sa.Column('run_id', sa.Integer(), nullable=False, comment='The run (runs.id).'),
    sa.Column('rank', sa.Integer(), nullable=False, comment='Distributed rank of the recording process.'),
    sa.Column('hostname', sa.String(length=255), nullable=True, comment='Host the rank ran on.'),
    sa.Column('pid', sa.Integer(), nullable=True, comment='Process id of the rank.'),
    sa.Column('status', sa.String(length=16), nullable=False, comment='running | completed | failed | interrupted, for this rank.'),
    sa.Column('started_at', sa.String(length=32), nullable=False, comment='UTC start time of this rank, ISO 8601.'),
    sa.Column('ended_at', sa.String(length=32), nullable=True, comment='UTC end time of this rank, ISO 8601.'),
    sa.Column('wall_anchor_ns', sa.BigInteger(), nullable=False, comment='Wall-clock time (ns since the Unix epoch) at ts_ns = 0 of this rank; aligns ranks.'),
    sa.Column('event_count', sa.BigInteger(), server_default='0', nullable=False, comment='Events written so far by this rank.'),
    sa.Column('step_count', sa.Integer(), server_default='0', nullable=False, comment='Steps completed so far by this rank.'),
    sa.CheckConstraint("status IN ('running', 'completed', 'failed', 'interrupted')", name='ck_run_ranks_status'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_run_ranks_run', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'rank', name='pk_run_ranks'),
    comment='One row per rank of a run: its process, clock anchor and progress.'
    )
    op.create_table('threads',
    sa.Column('run_id', sa.Integer(), nullable=False, comment='The run (runs.id).'),
    sa.Column('rank', sa.Integer(), nullable=False, comment='Rank of the process.'),
    sa.Column('thread_id', sa.Integer(), nullable=False, comment='Small thread number within (run_id, rank), in order of first event.'),
    sa.Column('ident', sa.BigInteger(), nullable=False, comment='threading.get_ident() of the thread.'),
    sa.Column('name', sa.Text(), nullable=True, comment='Thread name.'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_threads_run', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'rank', 'thread_id', name='pk_threads'),
    comment='Threads that produced events.'
    )
    op.execute(EVENT_LOG)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS event_log")
    op.drop_table('threads')
    op.drop_table('run_ranks')
    op.drop_table('modules')
    op.drop_table('events')
    op.drop_table('devices')
    op.drop_table('runs')
