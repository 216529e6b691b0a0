"""recording schedule: the schedule a run was recorded with, and the steps each rank recorded

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 11:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SCHEDULE_COMMENT = ("The recording schedule, as `modtrace record --schedule` takes it (e.g. "
                    "'skip_first=10,wait=5,warmup=1,active=20,repeat=3'); NULL when every step was recorded.")
RECORDED_STEPS_COMMENT = ("The steps this rank recorded under the run's schedule, as ranges (e.g. '10-29,35-54'); "
                          "NULL when the run has no schedule (every step recorded).")


def upgrade() -> None:
    op.add_column("runs", sa.Column("schedule", sa.Text(), nullable=True, comment=SCHEDULE_COMMENT))
    op.add_column("run_ranks", sa.Column("recorded_steps", sa.Text(), nullable=True, comment=RECORDED_STEPS_COMMENT))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): a batch copy of the
    # table would break the event_log view that reads it.
    op.drop_column("run_ranks", "recorded_steps")
    op.drop_column("runs", "schedule")
