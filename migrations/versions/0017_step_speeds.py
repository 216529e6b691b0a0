"""step_speeds: the speed probe the recorder times before each recorded step
(Recorder(speed_probe=True), modtrace record --speed-probe), which a history gate divides
step times by

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "step_speeds",
        sa.Column("run_id", sa.Integer(), nullable=False, comment="The run (runs.id)."),
        sa.Column("rank", sa.Integer(), nullable=False, comment="Rank that took the probe."),
        sa.Column("ts_ns", sa.BigInteger(), nullable=False,
                  comment="When the probe started, on the events' clock (as events.ts_ns)."),
        sa.Column("step", sa.Integer(), nullable=False,
                  comment="The recorder's step number the probe was taken before (events.step of the step that followed)."),
        sa.Column("seq", sa.BigInteger(), nullable=False,
                  comment="events.seq the rank's next event took: the probe ran between event seq - 1 and event seq."),
        sa.Column("probe_ns", sa.BigInteger(), nullable=False,
                  comment="How long the probe's fixed work took (modtrace.recording.speed_probe): the machine's speed just before the step; larger is slower."),
        sa.Column("cpu_ns", sa.BigInteger(), nullable=True,
                  comment="The recording thread's CPU time at the probe's start (time.thread_time_ns); NULL when the events' clock was injected."),
        sa.Column("real_ns", sa.BigInteger(), nullable=True,
                  comment="The host's clock at the same moment (time.perf_counter_ns): from one probe to the next, the CPU time over this is the share of the time the program ran."),
        sa.PrimaryKeyConstraint("run_id", "rank", "step", name="pk_step_speeds"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_step_speeds_run"),
        sqlite_with_rowid=False,
        comment="The speed probe timed before each recorded step (Recorder(speed_probe=True), modtrace record --speed-probe), written by the recorder at the end of the recording; a history gate divides step times by it.",
    )


def downgrade() -> None:
    op.drop_table("step_speeds")
