"""rank faults: reconnects, dropped events and steps, calls in forked children;
nesting issues about invalid rows (kinds invalid_row, time_reversed, seq_gap; phase may be NULL)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 08:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_OLD_KIND = ("no_enter | unclosed | crossed | reentered | duplicate_enter | duplicate_exit | error_exit | early_stop"
             " | closed_at_end_of_backward.")
_KIND = _OLD_KIND[:-1] + " | invalid_row | time_reversed | seq_gap."
_PHASE = "forward | backward | recompute; NULL for an invalid_row whose phase code is unknown."


def upgrade() -> None:
    for column in (
        sa.Column("reconnects", sa.Integer(), server_default="0", nullable=False, comment="Times this rank's writer lost its database connection (or found the database locked past the busy timeout) and resumed on a new one."),
        sa.Column("dropped_events", sa.BigInteger(), server_default="0", nullable=False, comment="Events not stored because the database stayed unreachable while more than the recorder's memory bound waited (whole steps are dropped)."),
        sa.Column("dropped_steps", sa.Text(), nullable=True, comment="The steps whose events were dropped, as ranges (e.g. '31-35,40'); NULL when none."),
        sa.Column("fork_calls", sa.BigInteger(), server_default="0", nullable=False, comment="Module calls made in child processes forked during the recording (e.g. DataLoader workers); not recorded."),
    ):
        op.add_column("run_ranks", column)
    with op.batch_alter_table("nesting_issues") as batch:
        batch.alter_column("kind", existing_type=sa.String(32), existing_nullable=False, comment=_KIND)
        batch.alter_column("phase", existing_type=sa.String(16), nullable=True, comment=_PHASE)


def downgrade() -> None:
    op.execute("DELETE FROM nesting_issues WHERE phase IS NULL")
    with op.batch_alter_table("nesting_issues") as batch:
        batch.alter_column("kind", existing_type=sa.String(32), existing_nullable=False, comment=_OLD_KIND)
        batch.alter_column("phase", existing_type=sa.String(16), nullable=False, comment="forward | backward | recompute.")
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): a batch copy of the
    # table would break the event_log view that reads it.
    for name in ("fork_calls", "dropped_steps", "dropped_events", "reconnects"):
        op.drop_column("run_ranks", name)
