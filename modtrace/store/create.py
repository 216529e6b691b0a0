"""The views of the schema at head, and a new database created at head in one transaction.

A new database needs no history: ``create_at_head`` builds the tables and
indexes from ``schema.metadata`` and the views below, and stamps the
Alembic version table at ``HEAD``, all in one transaction (Alembic's
upgrade through every revision takes a commit per step and is much slower;
docs/performance.md, "Writer process and event writes").
The migrations keep their own copies of each view as it was released;
tests/store/test_migrations.py proves a database created here equals one upgraded
through every migration.
"""

from __future__ import annotations

from sqlalchemy import Connection
from sqlalchemy.schema import CreateIndex, CreateTable

from modtrace.core.contracts import SPAN_STORED_AS
from modtrace.store.schema import HEAD, VERSION_TABLE, metadata

EVENT_LOG = """
CREATE VIEW event_log AS
SELECT
    e.run_id,
    e.seq,
    e.ts_ns,
    CASE e.kind WHEN 0 THEN 'enter' WHEN 1 THEN 'exit' END AS kind,
    m.fqn,
    m.module_type,
    CASE e.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute' WHEN 3 THEN 'backward_call' END AS phase,
    e.call_id,
    e.step,
    e.rank,
    e.thread_id,
    d.name AS device,
    e.stream,
    CASE e.status WHEN 0 THEN 'ok' WHEN 1 THEN 'error' WHEN 2 THEN 'early_stop'
        WHEN 3 THEN 'closed_at_end_of_backward' WHEN 4 THEN 'no_enter' WHEN 5 THEN 'unlinked' WHEN 6 THEN 'attributed' END AS status,
    e.graph_task,
    e.tie,
    e.module_id,
    r.wall_anchor_ns + e.ts_ns AS wall_ns,
    de.device_ts_ns,
    de.mem_bytes
FROM events e
JOIN modules m ON m.run_id = e.run_id AND m.rank = e.rank AND m.module_id = e.module_id
JOIN run_ranks r ON r.run_id = e.run_id AND r.rank = e.rank
LEFT JOIN devices d ON d.run_id = e.run_id AND d.rank = e.rank AND d.device_id = e.device_id
LEFT JOIN device_events de ON de.run_id = e.run_id AND de.rank = e.rank AND de.seq = e.seq
"""

# The spans view decodes span_rows' compact columns as the contract says (SPAN_STORED_AS).
_STORED_AS = {d.column: d.sql("s") for d in SPAN_STORED_AS}

SPANS = f"""
CREATE VIEW spans AS
SELECT
    s.run_id,
    s.rank,
    s.span_id,
    {_STORED_AS["parent_span_id"]} AS parent_span_id,
    s.depth,
    m.fqn,
    m.module_type,
    CASE s.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute' WHEN 3 THEN 'backward_call' END AS phase,
    s.call_id,
    s.step,
    s.thread_id,
    s.start_ns,
    {_STORED_AS["end_ns"]} AS end_ns,
    s.duration_ns,
    s.self_ns,
    d.name AS device,
    s.stream,
    CASE WHEN s.status IS NULL THEN 'unclosed' WHEN s.status = 0 THEN 'ok' WHEN s.status = 1 THEN 'error'
        WHEN s.status = 2 THEN 'early_stop' WHEN s.status = 3 THEN 'closed_at_end_of_backward'
        WHEN s.status = 4 THEN 'no_enter' WHEN s.status = 6 THEN 'attributed' END AS status,
    s.graph_task,
    {_STORED_AS["exit_seq"]} AS exit_seq,
    s.module_id,
    sd.device_start_ns,
    sd.device_end_ns,
    sd.device_duration_ns,
    sd.device_self_ns,
    sd.mem_delta_bytes,
    sd.mem_max_bytes,
    sc.flops,
    sc.flops_self,
    sc.bytes,
    sc.bytes_self,
    sc.ops,
    sc.ops_self,
    sc.unknown_ops,
    sc.unknown_ops_self,
    sm.kept_mem_bytes,
    sm.kept_mem_bytes_self,
    sm.peak_mem_bytes,
    sm.peak_mem_bytes_self
FROM span_rows s
JOIN modules m ON m.run_id = s.run_id AND m.rank = s.rank AND m.module_id = s.module_id
LEFT JOIN devices d ON d.run_id = s.run_id AND d.rank = s.rank AND d.device_id = s.device_id
LEFT JOIN span_device_rows sd ON sd.run_id = s.run_id AND sd.rank = s.rank AND sd.span_id = s.span_id
LEFT JOIN span_counter_rows sc ON sc.run_id = s.run_id AND sc.rank = s.rank AND sc.span_id = s.span_id
LEFT JOIN span_memory_rows sm ON sm.run_id = s.run_id AND sm.rank = s.rank AND sm.span_id = s.span_id
"""

# The run's steps as its analysis stored them (step_rows, step_starts; modtrace.results.materialize
# computes them with modtrace.analysis).  A span's step is that of the latest step_starts row of
# its thread at or before it, found by counting them (one window, partitioned by run_id first so
# that a filter on run_id reaches span_rows' key) and then joined by equality: a correlated
# "latest row" subquery per span costs PostgreSQL a subplan call per span.
SPAN_STEPS = """
CREATE VIEW span_steps AS
SELECT c.run_id, c.rank, c.span_id, b.step, c.recorded_step, t.step_rule
FROM (
    -- nth: the thread's step_starts rows at or before the span (the latest is its step's)
    SELECT
        s.run_id, s.rank, s.span_id, s.thread_id, s.step AS recorded_step,
        COUNT(a.span_id) OVER (PARTITION BY s.run_id, s.rank, s.thread_id ORDER BY s.span_id) AS nth
    FROM span_rows s
    LEFT JOIN step_starts a ON a.run_id = s.run_id AND a.rank = s.rank AND a.thread_id = s.thread_id AND a.span_id = s.span_id
) c
JOIN step_starts b ON b.run_id = c.run_id AND b.rank = c.rank AND b.thread_id = c.thread_id AND b.nth = c.nth
JOIN step_rows t ON t.run_id = b.run_id AND t.rank = b.rank AND t.step = b.step
"""

# One row per (run, rank, step) under the run's step rule: modtrace.analysis.step_time's step table, stored.
STEPS = """
CREATE VIEW steps AS
SELECT
    run_id,
    rank,
    step,
    step_rule,
    start_ns,
    wall_ns,
    step_ns,
    forward_ns,
    backward_ns,
    recompute_ns,
    spans,
    unclosed
FROM step_rows
"""

VIEWS: tuple[str, ...] = (EVENT_LOG, SPANS, SPAN_STEPS, STEPS)

# span_rows has no foreign key to runs (modtrace.store.schema says why): deleting a run
# deletes its spans by this trigger instead, as ON DELETE CASCADE did.  PostgreSQL's
# function names the table in the schema of the runs table the row left.
RUN_SPANS_TRIGGER = {
    "sqlite": ("CREATE TRIGGER trg_runs_delete_span_rows AFTER DELETE ON runs "
               "BEGIN DELETE FROM span_rows WHERE run_id = OLD.id; END",),
    "postgresql": (
        "CREATE FUNCTION modtrace_delete_run_span_rows() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "EXECUTE format('DELETE FROM %I.span_rows WHERE run_id = $1', TG_TABLE_SCHEMA) USING OLD.id; "
        "RETURN OLD; END $$",
        "CREATE TRIGGER trg_runs_delete_span_rows AFTER DELETE ON runs FOR EACH ROW "
        "EXECUTE FUNCTION modtrace_delete_run_span_rows()",
    ),
}


def head_ddl(conn: Connection) -> list[str]:
    """Every statement that builds the head schema on ``conn``'s dialect, in order."""
    dialect = conn.dialect
    out: list[str] = []
    for table in metadata.sorted_tables:
        out.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            out.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    out.extend(v.strip() for v in VIEWS)
    out.extend(RUN_SPANS_TRIGGER[dialect.name])
    out.append(f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL, "
               f"CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))")
    out.append(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES ('{HEAD}')")
    return out


def create_at_head(conn: Connection) -> None:
    """Build the head schema on an empty SQLite database in one transaction (``conn`` is not in one)."""
    statements = head_ddl(conn)
    raw = conn.connection.driver_connection
    assert raw is not None
    old = raw.isolation_level
    raw.isolation_level = None  # the driver would commit before each CREATE: BEGIN here, COMMIT once
    try:
        raw.execute("BEGIN IMMEDIATE")
        try:
            for sql in statements:
                raw.execute(sql)
        except BaseException:
            raw.execute("ROLLBACK")
            raise
        raw.execute("COMMIT")
    finally:
        raw.isolation_level = old
