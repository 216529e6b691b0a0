"""step_speeds.work: which fixed work the speed probe timed, now its layers forward and backward
(a training step's shape, which follows the step's speed 1.4 to 2 times as closely as the forward
alone did), so that probes of different work are never compared

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

COMMENT = ("Which fixed work the probe timed (modtrace.core.codes.ProbeWork): 2 the probe's layers forward with "
           "autograd and their backward; NULL for probes recorded before revision 0019 (the layers forward only). A "
           "history gate adjusts step times only where every run's probes did the same work.")


def upgrade() -> None:
    op.add_column("step_speeds", sa.Column("work", sa.SmallInteger(), nullable=True, comment=COMMENT))


def downgrade() -> None:
    with op.batch_alter_table("step_speeds") as batch:
        batch.drop_column("work")
