"""``modtrace query``: names, files and statements; bound parameters; output
formats; one-line usage errors; and a connection that cannot write (every
refused statement leaves the SQLite file byte-identical and PostgreSQL's rows
unchanged)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from modtrace.store.query import library, open_readonly
from tests.helpers.postgres import fresh_schema
from tests.helpers.recording import FakeClock
from tests.helpers.training import record_training

RUN = "qrun"


def _record(db: str) -> None:
    clock = FakeClock()  # one clock: the second run starts after the first
    for name in ("older", RUN):
        record_training(db, name, 2, clock=clock)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("query_cli") / "recorded.db"
    _record(str(path))
    return path


@pytest.fixture
def db(recorded: Path, tmp_path: Path) -> Path:
    """A private copy of the recorded database (its WAL, if any, too)."""
    target = tmp_path / "copy.db"
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{recorded}{suffix}")
        if src.exists():
            shutil.copy(src, f"{target}{suffix}")
    return target


@pytest.fixture(scope="module")
def pg_db() -> Iterator[str]:
    with fresh_schema() as url:
        _record(url)
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_recorded(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return str(request.getfixturevalue("db"))
    return str(request.getfixturevalue("pg_db"))


def _files(path: Path) -> dict[str, str]:
    """sha256 of the database file and of its WAL's content (an empty WAL counts as none)."""
    out = {"db": hashlib.sha256(path.read_bytes()).hexdigest()}
    wal = Path(f"{path}-wal")
    out["wal"] = hashlib.sha256(wal.read_bytes()).hexdigest() if wal.exists() and wal.stat().st_size else ""
    return out


# --- the library ---------------------------------------------------------------------------


def test_list_shows_every_query_with_its_purpose(run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("query", "--list", "--format", "json")
    assert res.code == 0, res
    listed = {r["name"]: r for r in json.loads(res.out)}
    assert set(listed) == {q.name for q in library()}
    assert len(listed) >= 10
    for q in library():
        assert listed[q.name]["purpose"] == q.purpose
        assert listed[q.name]["parameters"].split() == [f":{p}" for p in q.param_names]
    table = run_cli("query", "--list")
    assert table.code == 0 and "top_self_time" in table.out and "Top modules by self time" in table.out


def test_named_query_in_every_format(run_cli, any_recorded: str) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("query", "top_self_time", "--db", any_recorded, "--run", RUN, "--format", "json")
    assert res.code == 0, res
    rows = json.loads(res.out)
    assert rows and list(rows[0]) == ["fqn", "module_type", "calls", "self_ms", "self_pct", "forward_ms",
                                      "backward_ms", "recompute_ms", "self_us_per_call"]
    assert {r["fqn"] for r in rows} == {"Sequential", "Sequential.0", "Sequential.1", "Sequential.2"}
    assert all(isinstance(r["calls"], int) and isinstance(r["self_ms"], float) for r in rows)
    csv = run_cli("query", "top_self_time.sql", "--db", any_recorded, "--run", RUN, "--format", "csv")
    assert csv.code == 0 and csv.out.splitlines()[0].startswith("fqn,module_type,calls,self_ms")
    assert len(csv.out.splitlines()) == len(rows) + 1
    table = run_cli("query", "top_self_time", "--db", any_recorded, "--run", RUN, "-p", "limit=1")
    assert table.code == 0 and len(table.out.splitlines()) == 2  # header and one row


def test_run_references_and_run_parameters(run_cli, any_recorded: str) -> None:  # type: ignore[no-untyped-def]
    by_name = run_cli("query", "call_counts", "--db", any_recorded, "--run", RUN, "--format", "json")
    newest = run_cli("query", "call_counts", "--db", any_recorded, "--run", "@", "--format", "json")
    as_param = run_cli("query", "call_counts", "--db", any_recorded, "-p", "run_id=qrun", "--format", "json")
    assert by_name.code == newest.code == as_param.code == 0
    assert by_name.out == newest.out == as_param.out
    other = run_cli("query", "call_counts", "--db", any_recorded, "--run", "@~1", "--format", "json")
    assert other.code == 0 and json.loads(other.out)  # the older run, same shape
    res = run_cli("query", "regressions", "--db", any_recorded, "-p", "base_run=@~1", "-p", "cand_run=@",
                  "--format", "json")
    assert res.code == 0, res
    assert {r["change"] for r in json.loads(res.out)} <= {"same", "slower", "faster"}


def test_parameters_are_bound_never_pasted(run_cli, any_recorded: str) -> None:  # type: ignore[no-untyped-def]
    sql = "SELECT name FROM runs WHERE name = :name ORDER BY id"
    hit = run_cli("query", sql, "--db", any_recorded, "-p", f"name={RUN}", "--format", "json")
    assert hit.code == 0 and json.loads(hit.out) == [{"name": RUN}]
    for evil in ("x' OR '1'='1", "qrun'; DROP TABLE runs; --", "' UNION SELECT fqn FROM modules --"):
        res = run_cli("query", sql, "--db", any_recorded, "-p", f"name={evil}", "--format", "json")
        assert res.code == 0 and json.loads(res.out) == [], evil
    # a colon inside a literal or a cast is not a parameter
    lit = run_cli("query", "SELECT 'a :b' AS s, CAST(:n AS INTEGER) + 1 AS n", "--db", any_recorded, "-p", "n=41",
                  "--format", "json")
    assert lit.code == 0 and json.loads(lit.out) == [{"s": "a :b", "n": 42}]


def test_query_file_with_header_defaults(run_cli, any_recorded: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mine.sql"
    path.write_text(
        "-- Forward calls of one module.\n"
        "--\n"
        "-- Parameters:\n"
        "--   :run_id  the run\n"
        "--   :fqn     module name (default: Sequential.0)\n"
        "--\n"
        "-- Columns:\n"
        "--   calls  forward spans\n"
        "SELECT COUNT(*) AS calls FROM spans WHERE run_id = :run_id AND fqn = :fqn AND phase = 'forward'\n"
    )
    res = run_cli("query", str(path), "--db", any_recorded, "--run", RUN, "--format", "json")
    assert res.code == 0 and json.loads(res.out) == [{"calls": 2}]
    res = run_cli("query", str(path), "--db", any_recorded, "--run", RUN, "-p", "fqn=nothing", "--format", "json")
    assert res.code == 0 and json.loads(res.out) == [{"calls": 0}]


def test_postgres_numeric_results_come_back_as_numbers(run_cli, pg_db: str) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("query", "SELECT SUM(duration_ns) AS total, AVG(duration_ns) AS mean FROM spans", "--db", pg_db,
                  "--format", "json")
    assert res.code == 0, res
    (row,) = json.loads(res.out)
    assert isinstance(row["total"], int) and isinstance(row["mean"], float)


# --- usage errors: one line, exit 2 --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["step_breakdown"], "query step_breakdown needs parameter :run_id (pass --run RUN or --param run_id=RUN)"),
        (["regressions", "-p", "base_run=@"], "query regressions needs parameter :cand_run (pass --param cand_run=VALUE)"),
        (["step_breakdown", "--run", RUN, "-p", "limit=3"],
         "query step_breakdown takes no parameter :limit (it takes :run_id)"),
        (["top_self_tim", "--run", RUN], "no query named 'top_self_tim' in the library; did you mean top_self_time?"),
        (["regressions", "--run", RUN], "query regressions has no :run_id parameter, so --run does not apply"),
        (["top_self_time", "--run", "nope"], "no run 'nope' in {db}"),
        (["top_self_time", "--run", RUN, "-p", "limit"], "--param wants KEY=VALUE, got 'limit'"),
        (["./missing.sql"], "no query file './missing.sql'"),
        ([], "give a query: a NAME from `modtrace query --list`, a .sql PATH or an SQL statement"),
    ],
)
def test_usage_errors(run_cli, db: Path, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("query", *args, "--db", str(db))
    assert (res.code, res.out) == (2, "")
    assert res.err == f"modtrace: error: {message.format(db=db)}\n"


def test_sql_error_is_one_line_exit_1(run_cli, db: Path) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("query", "SELECT nope FROM spans", "--db", str(db))
    assert res.code == 1 and res.err.startswith("modtrace: error: query failed: ") and res.err.count("\n") == 1
    assert "nope" in res.err


def test_a_missing_database_is_not_created(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "absent.db"
    res = run_cli("query", "SELECT 1", "--db", str(path))
    assert res.code == 1 and "no modtrace database" in res.err
    assert not path.exists() and list(tmp_path.iterdir()) == []


# --- read-only ------------------------------------------------------------------------------

REFUSED = [
    ("DELETE FROM runs", "got DELETE"),
    ("delete from events where run_id = 1", "got DELETE"),
    ("UPDATE runs SET name = 'x'", "got UPDATE"),
    ("INSERT INTO runs (name, status, started_at) VALUES ('x', 'running', 'now')", "got INSERT"),
    ("DROP TABLE events", "got DROP"),
    ("CREATE TABLE t (x INTEGER)", "got CREATE"),
    ("ALTER TABLE runs ADD COLUMN x INTEGER", "got ALTER"),
    ("PRAGMA journal_mode = DELETE", "got PRAGMA"),
    ("PRAGMA user_version = 7", "got PRAGMA"),
    ("VACUUM", "got VACUUM"),
    ("REPLACE INTO runs (id, name, status, started_at) VALUES (1, 'x', 'running', 'now')", "got REPLACE"),
    ("SELECT 1; DELETE FROM runs", "one statement at a time; got 2 (SELECT, DELETE)"),
    ("WITH x AS (SELECT 1) DELETE FROM runs", "this WITH statement contains DELETE"),
    ("SELECT * INTO runs_copy FROM runs", "this SELECT statement contains INTO"),
    ("/* hidden */ -- comment\n DELETE FROM runs", "got DELETE"),
    ("BEGIN", "got BEGIN"),
]


@pytest.mark.parametrize(("sql", "why"), REFUSED)
def test_writes_are_refused_and_sqlite_is_untouched(run_cli, db: Path, tmp_path: Path, sql: str, why: str) -> None:  # type: ignore[no-untyped-def]
    before = _files(db)
    res = run_cli("query", sql, "--db", str(db))
    assert (res.code, res.out) == (2, "")
    assert res.err.startswith("modtrace: error: query refused: ") and why in res.err and res.err.count("\n") == 1
    assert _files(db) == before


@pytest.mark.parametrize("sql", ["ATTACH DATABASE '{new}' AS other", "VACUUM INTO '{new}'"])
def test_statements_that_would_create_files_are_refused(run_cli, db: Path, tmp_path: Path, sql: str) -> None:  # type: ignore[no-untyped-def]
    new = tmp_path / "created.db"
    before = _files(db)
    res = run_cli("query", sql.format(new=new), "--db", str(db))
    assert res.code == 2 and "query refused" in res.err
    assert not new.exists()
    assert _files(db) == before


def test_reads_leave_sqlite_untouched(run_cli, db: Path) -> None:  # type: ignore[no-untyped-def]
    before = _files(db)
    for q in library():
        args = ["-p", "base_run=@~1", "-p", "cand_run=@"] if q.name == "regressions" else ["--run", RUN]
        res = run_cli("query", q.name, "--db", str(db), *args)
        assert res.code == 0, (q.name, res)
    assert _files(db) == before


def test_the_sqlite_connection_itself_cannot_write(db: Path, tmp_path: Path) -> None:
    """Below the statement check: read-only open, query_only and an authorizer that denies writes."""
    store = open_readonly(str(db))
    new = tmp_path / "attached.db"
    before = _files(db)
    try:
        with store.engine.connect() as conn:
            for sql in ("DELETE FROM runs", "UPDATE runs SET name = 'x'", f"ATTACH DATABASE '{new}' AS other",
                        "PRAGMA query_only = OFF", "CREATE TEMP TABLE t (x INTEGER)"):
                with pytest.raises(sa.exc.DatabaseError, match="not authorized|readonly"):
                    conn.exec_driver_sql(sql)
            assert conn.exec_driver_sql("SELECT COUNT(*) FROM runs").scalar() == 2
            assert conn.exec_driver_sql("SELECT COUNT(*) FROM pragma_table_info('spans')").scalar() > 0
    finally:
        store.dispose()
    assert not new.exists()
    assert _files(db) == before


def _pg_state(url: str) -> dict[str, object]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            names = sorted(sa.inspect(conn).get_table_names())
            state: dict[str, object] = {"tables": names, "views": sorted(sa.inspect(conn).get_view_names())}
            for name in names:
                state[name] = conn.exec_driver_sql(
                    f"SELECT COUNT(*), md5(COALESCE(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {name} t"
                ).one()
            state["seq"] = conn.exec_driver_sql("SELECT last_value FROM runs_id_seq").scalar()
        return state
    finally:
        engine.dispose()


def test_postgres_refuses_writes_and_stays_unchanged(run_cli, pg_db: str) -> None:  # type: ignore[no-untyped-def]
    before = _pg_state(pg_db)
    for sql, why in REFUSED:
        if sql.startswith(("PRAGMA", "REPLACE", "VACUUM")):
            continue
        res = run_cli("query", sql, "--db", pg_db)
        assert res.code == 2 and res.err.startswith("modtrace: error: query refused: ") and why in res.err, (sql, res)
    for sql in ("WITH d AS (DELETE FROM runs RETURNING id) SELECT * FROM d",
                "SELECT id FROM runs FOR UPDATE", "SET default_transaction_read_only = off"):
        res = run_cli("query", sql, "--db", pg_db)
        assert res.code == 2 and "query refused" in res.err, (sql, res)
    # passes the statement check, stopped by the read-only transaction
    res = run_cli("query", "SELECT nextval('runs_id_seq')", "--db", pg_db)
    assert res.code == 2
    assert res.err == "modtrace: error: query refused: the connection is read-only " \
                      "(cannot execute nextval() in a read-only transaction)\n"
    for q in library():
        args = ["-p", "base_run=@~1", "-p", "cand_run=@"] if q.name == "regressions" else ["--run", RUN]
        assert run_cli("query", q.name, "--db", pg_db, *args).code == 0, q.name
    assert _pg_state(pg_db) == before


def test_editable_install_uses_the_repository_queries() -> None:
    from modtrace.store.query import queries_dir

    assert queries_dir() == Path(__file__).resolve().parents[2] / "queries"


@pytest.mark.parametrize(
    ("sql", "params", "statements"),
    [
        ("SELECT :a, :b, :a", ("a", "b"), 1),
        ("SELECT 'it''s :not; a param' AS x -- :nor ; this\nFROM runs", (), 1),
        ('SELECT ":quoted;" FROM runs /* :hidden; */ WHERE id = :id;', ("id",), 1),
        ("SELECT x::bigint, 'a:b' FROM t WHERE y = :y", ("y",), 1),
        ("SELECT 1e6 AS million; SELECT 2", (), 2),
        ("-- only a comment\n", (), 0),
    ],
)
def test_scanning_finds_parameters_and_statements(sql: str, params: tuple[str, ...], statements: int) -> None:
    from modtrace.store.query import scan_sql

    scanned = scan_sql(sql)
    assert scanned.params == params
    assert len(scanned.statements) == statements
    assert "--" not in scanned.bindable and "/*" not in scanned.bindable


@pytest.mark.parametrize("table", ["readonly database", "not authorized", "read-only transaction"])
def test_a_failure_that_mentions_refusal_is_a_failure_not_a_refusal(run_cli, db: Path, table: str) -> None:  # type: ignore[no-untyped-def]
    # Whether a query was refused is what the database says (authorizer, result code, SQLSTATE),
    # never words in its message: a missing table named like a refusal is a plain failure.
    res = run_cli("query", "--db", str(db), f'SELECT * FROM "{table}"')
    assert res.code == 1, res
    assert res.err == f"modtrace: error: query failed: no such table: {table}\n"
