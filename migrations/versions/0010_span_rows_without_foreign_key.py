"""span_rows without a foreign key to runs: a trigger on runs deletes a run's spans
instead (PostgreSQL checked the key with a trigger per inserted span, three quarters
of the time of writing a run's spans)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 14:40:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# Written out here, not imported, so this revision stays as released.
_SQLITE_TRIGGER = ("CREATE TRIGGER trg_runs_delete_span_rows AFTER DELETE ON runs "
                   "BEGIN DELETE FROM span_rows WHERE run_id = OLD.id; END")
_PG_FUNCTION = (
    "CREATE FUNCTION modtrace_delete_run_span_rows() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "EXECUTE format('DELETE FROM %I.span_rows WHERE run_id = $1', TG_TABLE_SCHEMA) USING OLD.id; "
    "RETURN OLD; END $$"
)
_PG_TRIGGER = ("CREATE TRIGGER trg_runs_delete_span_rows AFTER DELETE ON runs FOR EACH ROW "
               "EXECUTE FUNCTION modtrace_delete_run_span_rows()")

_COLUMNS = """
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    span_id BIGINT NOT NULL,
    depth INTEGER NOT NULL,
    module_id INTEGER NOT NULL,
    phase SMALLINT NOT NULL,
    call_id BIGINT NOT NULL,
    step INTEGER NOT NULL,
    thread_id INTEGER NOT NULL,
    graph_task BIGINT,
    start_ns BIGINT NOT NULL,
    duration_ns BIGINT,
    self_ns BIGINT,
    device_id INTEGER,
    stream BIGINT,
    status SMALLINT,
    parent_gap BIGINT,
    exit_gap BIGINT,
    CONSTRAINT pk_span_rows PRIMARY KEY (run_id, rank, span_id)"""
_FOREIGN_KEY = ",\n    CONSTRAINT fk_span_rows_run FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE"


def _rebuild_sqlite(foreign_key: bool) -> None:
    """SQLite cannot drop or add a constraint: the table is copied into a new one (the
    spans view reads it, so it goes and comes back around the copy)."""
    spans = op.get_bind().exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'view' AND name = 'spans'").scalar()
    op.execute("DROP VIEW IF EXISTS spans")
    op.execute(f"CREATE TABLE span_rows_copy ({_COLUMNS}{_FOREIGN_KEY if foreign_key else ''}\n) WITHOUT ROWID")
    op.execute("INSERT INTO span_rows_copy SELECT * FROM span_rows" +
               (" WHERE run_id IN (SELECT id FROM runs)" if foreign_key else ""))
    op.execute("DROP TABLE span_rows")
    op.execute("ALTER TABLE span_rows_copy RENAME TO span_rows")
    if spans:
        op.execute(spans)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(foreign_key=False)
        op.execute(_SQLITE_TRIGGER)
    else:
        op.execute("ALTER TABLE span_rows DROP CONSTRAINT fk_span_rows_run")
        op.execute(_PG_FUNCTION)
        op.execute(_PG_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS trg_runs_delete_span_rows" +
               ("" if op.get_bind().dialect.name == "sqlite" else " ON runs"))
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(foreign_key=True)
    else:
        op.execute("DROP FUNCTION IF EXISTS modtrace_delete_run_span_rows()")
        op.execute("DELETE FROM span_rows WHERE run_id NOT IN (SELECT id FROM runs)")
        op.execute("ALTER TABLE span_rows ADD CONSTRAINT fk_span_rows_run FOREIGN KEY (run_id) "
                   "REFERENCES runs (id) ON DELETE CASCADE")
