"""runs.analysis and run_ranks.analysis: whether a run's (a rank's) spans and nesting
issues are stored (none | partial | stale | stored), so that a run not analysed yet is
not mistaken for one with nothing in it

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# Written out here, not imported, so this revision stays as released.
_RUN = ("Whether the run's analysis (spans, nesting_issues) is stored: none (not analysed yet: recorded with "
        "--no-analyze, the recording's own analysis still under way or its process killed) | partial (some ranks' "
        "only) | stale (a rank recorded events after its analysis was stored) | stored. Until it is stored, "
        "`modtrace analyze RUN` stores it.")
_RANK = "Whether this rank's analysis is stored: none | stale (the rank recorded events after it was stored) | stored."

# A rank analysed before this revision has spans or issues stored (every event gives one or
# the other); a rank without events counts as analysed when another rank of its run is.
_RANKS_STORED = """
UPDATE run_ranks SET analysis = 'stored'
WHERE EXISTS (SELECT 1 FROM span_rows s WHERE s.run_id = run_ranks.run_id AND s.rank = run_ranks.rank)
   OR EXISTS (SELECT 1 FROM nesting_issues i WHERE i.run_id = run_ranks.run_id AND i.rank = run_ranks.rank)
   OR (NOT EXISTS (SELECT 1 FROM events e WHERE e.run_id = run_ranks.run_id AND e.rank = run_ranks.rank)
       AND (EXISTS (SELECT 1 FROM span_rows s WHERE s.run_id = run_ranks.run_id)
            OR EXISTS (SELECT 1 FROM nesting_issues i WHERE i.run_id = run_ranks.run_id)))
"""
_RUNS = """
UPDATE runs SET analysis = CASE
    WHEN NOT EXISTS (SELECT 1 FROM run_ranks k WHERE k.run_id = runs.id AND k.analysis = 'stored') THEN 'none'
    WHEN NOT EXISTS (SELECT 1 FROM run_ranks k WHERE k.run_id = runs.id AND k.analysis <> 'stored')
         AND (SELECT count(*) FROM run_ranks k WHERE k.run_id = runs.id) >= runs.world_size THEN 'stored'
    ELSE 'partial' END
"""


def upgrade() -> None:
    op.add_column("runs", sa.Column("analysis", sa.String(16), server_default="none", nullable=False, comment=_RUN))
    op.add_column("run_ranks", sa.Column("analysis", sa.String(16), server_default="none", nullable=False,
                                         comment=_RANK))
    op.execute(_RANKS_STORED)
    op.execute(_RUNS)


def downgrade() -> None:
    op.drop_column("run_ranks", "analysis")
    op.drop_column("runs", "analysis")
