"""step_speeds.threads: torch's intra-op threads when the probe was taken, so that a history
gate judges a step's CPU time only where the recording thread's CPU clock holds all of its work

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

COMMENT = ("torch's intra-op threads when the probe was taken (torch.get_num_threads()): with one, the recording "
           "thread's CPU time holds the step's work; NULL for probes recorded before revision 0018.")


def upgrade() -> None:
    op.add_column("step_speeds", sa.Column("threads", sa.SmallInteger(), nullable=True, comment=COMMENT))


def downgrade() -> None:
    with op.batch_alter_table("step_speeds") as batch:
        batch.drop_column("threads")
