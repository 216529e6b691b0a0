"""The views of the schema at head, and a new database created at head in one transaction.

A new database needs no history: ``create_at_head`` builds the tables and
indexes from ``schema.metadata`` and the views below, and stamps the
Alembic version table at ``HEAD``, all in one transaction (Alembic's
upgrade through every revision takes a commit per step and is much slower;
docs/performance.md).
The migrations keep their own copies of each view as it was released;
tests/store/test_migrations.py proves a database created here equals one upgraded
through every migration.
"""

from __future__ import annotations

from sqlalchemy import Connection
from sqlalchemy.schema import CreateIndex, CreateTable

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
        WHEN 3 THEN 'closed_at_end_of_backward' WHEN 4 THEN 'no_enter' WHEN 5 THEN 'unlinked' END AS status,
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

SPANS = """
CREATE VIEW spans AS
SELECT
    s.run_id,
    s.rank,
    s.span_id,
    s.span_id - s.parent_gap AS parent_span_id,
    s.depth,
    m.fqn,
    m.module_type,
    CASE s.phase WHEN 0 THEN 'forward' WHEN 1 THEN 'backward' WHEN 2 THEN 'recompute' WHEN 3 THEN 'backward_call' END AS phase,
    s.call_id,
    s.step,
    s.thread_id,
    s.start_ns,
    s.start_ns + s.duration_ns AS end_ns,
    s.duration_ns,
    s.self_ns,
    d.name AS device,
    s.stream,
    CASE WHEN s.status IS NULL THEN 'unclosed' WHEN s.status = 0 THEN 'ok' WHEN s.status = 1 THEN 'error'
        WHEN s.status = 2 THEN 'early_stop' WHEN s.status = 3 THEN 'closed_at_end_of_backward'
        WHEN s.status = 4 THEN 'no_enter' END AS status,
    s.graph_task,
    s.span_id + s.exit_gap AS exit_seq,
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
    sc.unknown_ops_self
FROM span_rows s
JOIN modules m ON m.run_id = s.run_id AND m.rank = s.rank AND m.module_id = s.module_id
LEFT JOIN devices d ON d.run_id = s.run_id AND d.rank = s.rank AND d.device_id = s.device_id
LEFT JOIN span_device_rows sd ON sd.run_id = s.run_id AND sd.rank = s.rank AND sd.span_id = s.span_id
LEFT JOIN span_counter_rows sc ON sc.run_id = s.run_id AND sc.rank = s.rank AND sc.span_id = s.span_id
"""

# Each span's step under its run's step rule (modtrace.core.step_rules.resolve_rule without a
# caller's choice; modtrace.analysis.steps.assign_steps under root), shared by the views
# span_steps and steps.  Each CTE reads the one before it, once, so a filter on run_id
# reaches span_rows (every window is partitioned by run_id first).
_STEPPED = """
WITH rules AS (
    SELECT
        r.id AS run_id,
        CASE WHEN COALESCE(r.step_on, 'optimizer') <> 'auto' THEN COALESCE(r.step_on, 'optimizer')
            WHEN EXISTS (SELECT 1 FROM run_ranks rr WHERE rr.run_id = r.id AND rr.step_count > 0) THEN 'optimizer'
            ELSE 'root' END AS step_rule
    FROM runs r
),
marked AS (
    -- root_ord: a root call's place among its rank's root calls, in start order
    SELECT
        s.run_id, s.rank, s.span_id, s.thread_id, s.step, s.depth, s.phase, s.start_ns, s.duration_ns, s.self_ns,
        CASE WHEN rc.seq IS NOT NULL THEN COUNT(rc.seq) OVER (PARTITION BY s.run_id, s.rank ORDER BY s.span_id) END AS root_ord
    FROM span_rows s
    LEFT JOIN root_calls rc ON rc.run_id = s.run_id AND rc.rank = s.rank AND rc.seq = s.span_id
),
latest AS (
    -- the latest root call entered on the span's thread, else on its rank
    SELECT
        run_id, rank, span_id, step, depth, phase, start_ns, duration_ns, self_ns,
        COALESCE(
            MAX(root_ord) OVER (PARTITION BY run_id, rank, thread_id ORDER BY span_id),
            MAX(root_ord) OVER (PARTITION BY run_id, rank ORDER BY span_id),
            0) AS root_ord
    FROM marked
),
stepped AS (
    SELECT
        l.run_id, l.rank, l.span_id,
        CASE WHEN u.step_rule = 'root'
            THEN DENSE_RANK() OVER (PARTITION BY l.run_id, l.rank ORDER BY l.step, l.root_ord) - 1
            ELSE l.step END AS step,
        l.step AS recorded_step, u.step_rule, l.depth, l.phase, l.start_ns, l.duration_ns, l.self_ns
    FROM latest l
    JOIN rules u ON u.run_id = l.run_id
)"""

SPAN_STEPS = f"""
CREATE VIEW span_steps AS{_STEPPED}
SELECT run_id, rank, span_id, step, recorded_step, step_rule
FROM stepped
"""

# One row per (run, rank, step) under the run's step rule: modtrace.analysis.step_time in SQL.
STEPS = f"""
CREATE VIEW steps AS{_STEPPED},
covering AS (
    -- covered: the latest end of the step's closed root spans started before this one
    SELECT
        run_id, rank, step, step_rule, depth, phase, start_ns, duration_ns, self_ns,
        MAX(CASE WHEN depth = 0 THEN start_ns + duration_ns END) OVER (
            PARTITION BY run_id, rank, step ORDER BY start_ns, span_id
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered
    FROM stepped
),
per_step AS (
    SELECT
        run_id, rank, step,
        MIN(step_rule) AS step_rule,
        MIN(start_ns) AS start_ns,
        MAX(COALESCE(start_ns + duration_ns, start_ns)) AS last_ns,
        CAST(SUM(CASE WHEN depth <> 0 OR duration_ns IS NULL THEN 0
            WHEN covered IS NULL OR start_ns >= covered THEN duration_ns
            WHEN start_ns + duration_ns > covered THEN start_ns + duration_ns - covered
            ELSE 0 END) AS BIGINT) AS step_ns,
        CAST(SUM(CASE WHEN phase = 0 THEN COALESCE(self_ns, 0) ELSE 0 END) AS BIGINT) AS forward_ns,
        CAST(SUM(CASE WHEN phase IN (1, 3) THEN COALESCE(self_ns, 0) ELSE 0 END) AS BIGINT) AS backward_ns,
        CAST(SUM(CASE WHEN phase = 2 THEN COALESCE(self_ns, 0) ELSE 0 END) AS BIGINT) AS recompute_ns,
        COUNT(*) AS spans,
        CAST(SUM(CASE WHEN duration_ns IS NULL THEN 1 ELSE 0 END) AS BIGINT) AS unclosed
    FROM covering
    GROUP BY run_id, rank, step
),
bounded AS (
    -- the next step's start ends a step when it is the next step and the step is over by then
    SELECT
        run_id, rank, step, step_rule, start_ns, last_ns, step_ns, forward_ns, backward_ns, recompute_ns,
        spans, unclosed,
        CASE WHEN LEAD(step) OVER (PARTITION BY run_id, rank ORDER BY step) = step + 1
            THEN LEAD(start_ns) OVER (PARTITION BY run_id, rank ORDER BY step) END AS next_ns
    FROM per_step
)
SELECT
    run_id,
    rank,
    step,
    step_rule,
    start_ns,
    CASE WHEN next_ns IS NULL OR last_ns > next_ns THEN last_ns ELSE next_ns END - start_ns AS wall_ns,
    step_ns,
    forward_ns,
    backward_ns,
    recompute_ns,
    spans,
    unclosed
FROM bounded
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
