"""stored module call tree: table tree_nodes, the tree modtrace tree shows by default,
written by modtrace analyze (a run analysed before has none: tree reads its spans)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 14:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The table as released, written out (not imported from modtrace.store.schema, which moves on).
    op.create_table(
        "tree_nodes",
        sa.Column("run_id", sa.Integer(), nullable=False, comment="The run (runs.id)."),
        sa.Column("clock", sa.String(8), nullable=False, comment="host | device: the clock the node's times are on (device rows only for a run with device times)."),
        sa.Column("node", sa.Integer(), nullable=False, comment="Position of the node in the tree's pre-order, from 0: children follow their parent in order of first call."),
        sa.Column("node_id", sa.BigInteger(), nullable=False, comment="The node's call path (the (phase, fqn) of each span from a root down) hashed, as a signed 64-bit integer; shared by the node's rows on both clocks."),
        sa.Column("parent_node_id", sa.BigInteger(), nullable=True, comment="node_id of the parent node; NULL at a root."),
        sa.Column("level", sa.Integer(), nullable=False, comment="Depth of the node in the tree, 0 at a root."),
        sa.Column("fqn", sa.Text(), nullable=False, comment="Fully qualified name of the node's module (modules.fqn)."),
        sa.Column("module_type", sa.String(200), nullable=False, comment="Class name of the node's module (modules.module_type)."),
        sa.Column("phase", sa.String(16), nullable=False, comment="forward | backward | recompute."),
        sa.Column("calls", sa.BigInteger(), nullable=False, comment="Spans on this path, every rank and step."),
        sa.Column("steps", sa.Integer(), nullable=False, comment="(rank, step) pairs the node ran in."),
        sa.Column("inclusive_total_ns", sa.BigInteger(), nullable=False, comment="Summed duration_ns of the node's spans, in nanoseconds (spans never exited count 0)."),
        sa.Column("self_total_ns", sa.BigInteger(), nullable=False, comment="Summed self_ns of the node's spans, in nanoseconds."),
        sa.Column("inclusive_median_ns", sa.Double(), nullable=False, comment="Median over the node's (rank, step) pairs of its summed duration_ns in that step, in nanoseconds."),
        sa.Column("self_median_ns", sa.Double(), nullable=False, comment="Median over the node's (rank, step) pairs of its summed self_ns in that step, in nanoseconds."),
        sa.Column("percent", sa.Double(), nullable=True, comment="inclusive_total_ns as a percentage of the run's summed step time (modtrace.analysis.step_time); NULL when that is 0."),
        sa.Column("step_rule", sa.String(16), nullable=False, comment="optimizer | manual | root: the step rule the steps followed (the run's own, resolved from runs.step_on)."),
        sa.PrimaryKeyConstraint("run_id", "clock", "node", name="pk_tree_nodes"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_tree_nodes_run"),
        sa.CheckConstraint("clock IN ('host', 'device')", name="ck_tree_nodes_clock"),
        sqlite_with_rowid=False,
        comment="The module call tree of a run as modtrace tree shows it by default (every rank, phase and step, the run's own step rule), written by modtrace analyze with the spans; modtrace tree reads it instead of the spans when its options allow.",
    )


def downgrade() -> None:
    op.drop_table("tree_nodes")
