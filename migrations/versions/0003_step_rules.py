"""steps without an optimizer: runs.step_on, root_calls

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 08:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Runs recorded before this revision advanced steps on optimizer steps and
    # Recorder.step(): 'optimizer' is what they did.
    op.add_column('runs', sa.Column('step_on', sa.String(length=16), server_default='optimizer', nullable=False, comment='What starts a step, as asked of the recorder: auto (optimizer steps when the run made any, else root calls) | optimizer (optimizer steps and Recorder.step()) | root (each root call, see root_calls) | manual (Recorder.step() only).'))
    op.create_table('root_calls',
    sa.Column('run_id', sa.Integer(), nullable=False, comment='The run (runs.id).'),
    sa.Column('rank', sa.Integer(), nullable=False, comment='Rank that recorded the call.'),
    sa.Column('seq', sa.BigInteger(), nullable=False, comment="events.seq of the call's enter event (spans.span_id of its forward span)."),
    sa.Column('call_id', sa.BigInteger(), nullable=False, comment='events.call_id of the call.'),
    sa.Column('kind', sa.Text(), nullable=True, comment="The call's input shape, the kind of the step it starts: its first tensor argument as NAME=SHAPE (input_ids=1x7); NULL when it has none."),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name='fk_root_calls_run', ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'rank', 'seq', name='pk_root_calls'),
    comment='Root calls: the outermost module calls on the main thread (each model(...) of a generate() or serving loop). Steps start at them when a run\'s steps follow root calls.',
    sqlite_with_rowid=False
    )


def downgrade() -> None:
    op.drop_table('root_calls')
    # A plain ALTER TABLE (SQLite >= 3.35 has DROP COLUMN): a batch copy of
    # runs would drop the old table, and with it, by cascade, every run's rows.
    op.drop_column('runs', 'step_on')
