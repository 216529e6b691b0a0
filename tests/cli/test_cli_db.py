"""``modtrace db`` and the database checks every command shares.

Each refusal is checked for its exact one-line message, its exit code, the
absence of a traceback, and a file left byte-identical (or not created).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from modtrace.store.schema import HEAD

READ_COMMANDS = [("runs",), ("show", "@"), ("db", "current"), ("db", "check")]
READ_IDS = ["runs", "show", "db-current", "db-check"]
ALL_COMMANDS = READ_COMMANDS + [("db", "upgrade")]
ALL_IDS = READ_IDS + ["db-upgrade"]


def _one_error_line(result, message: str, code: int = 1) -> None:  # type: ignore[no-untyped-def]
    assert result.code == code, result
    assert result.err == f"modtrace: error: {message}\n"
    assert result.out == ""


def _set_revision(url: str, rev: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": rev})
    finally:
        engine.dispose()


# --- db upgrade / current / check on a healthy database --------------------------


def test_upgrade_creates_then_reports_head(run_cli, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = run_cli("db", "upgrade", "--db", str(db_path))
    assert (first.code, first.out, first.err) == (0, f"{db_path}: created at {HEAD}\n", "")
    again = run_cli("db", "upgrade", "--db", str(db_path))
    assert (again.code, again.out) == (0, f"{db_path}: already at head ({HEAD})\n")
    current = run_cli("db", "current", "--db", str(db_path))
    assert (current.code, current.out) == (0, f"{HEAD} (head; this modtrace's head is {HEAD})\n")
    check = run_cli("db", "check", "--db", str(db_path))
    assert (check.code, check.out) == (0, f"{db_path}: schema is at head\n")


def test_db_option_falls_back_to_modtrace_db_env(run_cli, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    # conftest points MODTRACE_DB at db_path
    assert run_cli("db", "upgrade").out == f"{db_path}: created at {HEAD}\n"
    assert db_path.is_file()


def test_upgrade_and_current_on_postgres(run_cli, pg_url: str) -> None:  # type: ignore[no-untyped-def]
    first = run_cli("db", "upgrade", "--db", pg_url)
    assert first.code == 0 and first.out.endswith(f": created at {HEAD}\n"), first
    assert run_cli("db", "upgrade", "--db", pg_url).out.endswith(f": already at head ({HEAD})\n")
    assert run_cli("db", "current", "--db", pg_url).out == f"{HEAD} (head; this modtrace's head is {HEAD})\n"
    assert run_cli("db", "check", "--db", pg_url).code == 0


# --- read commands never create anything -------------------------------------------


@pytest.mark.parametrize("command", READ_COMMANDS, ids=READ_IDS)
def test_read_command_on_missing_file_creates_nothing(run_cli, tmp_path: Path, command) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "missing.db"
    result = run_cli(*command, "--db", str(path))
    _one_error_line(result, f"no modtrace database at {path} (record a run first, or pass --db)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", READ_COMMANDS, ids=READ_IDS)
def test_read_command_on_default_db_creates_nothing(run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("MODTRACE_DB")
    monkeypatch.chdir(tmp_path)
    result = run_cli(*command)
    _one_error_line(result, f"no modtrace database at {tmp_path / 'modtrace.db'} (record a run first, or pass --db)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", READ_COMMANDS, ids=READ_IDS)
def test_read_command_on_empty_file_leaves_it_empty(run_cli, tmp_path: Path, command) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "empty.db"
    path.touch()
    _one_error_line(run_cli(*command, "--db", str(path)), f"{path} is empty, not a modtrace database")
    assert path.stat().st_size == 0
    assert [p.name for p in tmp_path.iterdir()] == ["empty.db"]


def test_upgrade_initialises_an_empty_file(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "empty.db"
    path.touch()
    assert run_cli("db", "upgrade", "--db", str(path)).out == f"{path}: created at {HEAD}\n"


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=ALL_IDS)
def test_directory_is_refused(run_cli, tmp_path: Path, command) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "adir"
    target.mkdir()
    _one_error_line(run_cli(*command, "--db", str(target)), f"{target} is a directory, not a database file")
    assert list(target.iterdir()) == []


def test_read_command_on_empty_postgres_schema_creates_nothing(run_cli, pg_url: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("runs", "--db", pg_url)
    assert result.code == 1 and result.err.startswith("modtrace: error: ")
    assert result.err.endswith(" has no modtrace schema yet (record a run first, or run `modtrace db upgrade`)\n")
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert sa.inspect(conn).get_table_names() == []
    finally:
        engine.dispose()


# --- files that are not ours are refused and left byte-identical ---------------------


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=ALL_IDS)
def test_non_sqlite_file_is_refused_untouched(run_cli, tmp_path: Path, digest, command) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "report.db"
    path.write_bytes(b"%PDF-1.4 not a database\n" + bytes(range(256)) * 8)
    before = digest(path)
    _one_error_line(run_cli(*command, "--db", str(path)), f"{path} is not a SQLite database; refusing to touch it")
    assert digest(path) == before
    assert [p.name for p in tmp_path.iterdir()] == ["report.db"]


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=ALL_IDS)
def test_other_applications_sqlite_is_refused_untouched(run_cli, tmp_path: Path, digest, command) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "browser.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE bookmarks (id INTEGER PRIMARY KEY, url TEXT)")
        conn.execute("INSERT INTO bookmarks (url) VALUES ('https://example.org')")
    conn.close()
    before = digest(path)
    _one_error_line(
        run_cli(*command, "--db", str(path)),
        f"{path} is a SQLite database of another application (no modtrace schema); refusing to touch it",
    )
    assert digest(path) == before
    assert [p.name for p in tmp_path.iterdir()] == ["browser.db"]


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=ALL_IDS)
def test_postgres_tables_of_another_application_are_left_alone(run_cli, pg_url: str, command) -> None:  # type: ignore[no-untyped-def]
    engine = sa.create_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE events (id int primary key, title text)")
            conn.exec_driver_sql("INSERT INTO events VALUES (1, 'launch party')")
        result = run_cli(*command, "--db", pg_url)
        assert result.code == 1 and result.out == "" and result.err.count("\n") == 1
        if command == ("db", "upgrade"):
            assert result.err.endswith(" already has tables named events that modtrace did not create; refusing to touch them\n")
        else:
            assert result.err.endswith(" has no modtrace schema\n")
        with engine.connect() as conn:
            assert sa.inspect(conn).get_table_names() == ["events"]
            assert conn.exec_driver_sql("SELECT * FROM events").all() == [(1, "launch party")]
    finally:
        engine.dispose()


# --- schema revisions: newer and older ----------------------------------------------


@pytest.mark.parametrize("command", [c for c in ALL_COMMANDS if c != ("db", "current")],
                         ids=[i for i in ALL_IDS if i != "db-current"])
def test_newer_revision_tells_user_to_upgrade_modtrace(run_cli, any_db: str, digest, command) -> None:  # type: ignore[no-untyped-def]
    assert run_cli("db", "upgrade", "--db", any_db).code == 0
    url = any_db if "://" in any_db else f"sqlite:///{any_db}"
    _set_revision(url, "ffff")
    label = str(any_db) if "://" not in any_db else sa.make_url(any_db).render_as_string(hide_password=True)
    before = digest(Path(any_db)) if "://" not in any_db else None
    _one_error_line(
        run_cli(*command, "--db", any_db),
        f"{label} uses schema revision ffff, newer than this modtrace knows (head {HEAD}); upgrade modtrace",
    )
    if before is not None:
        assert digest(Path(any_db)) == before


def test_current_names_a_newer_revision(run_cli, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_cli("db", "upgrade", "--db", str(db_path))
    _set_revision(f"sqlite:///{db_path}", "ffff")
    result = run_cli("db", "current", "--db", str(db_path))
    assert (result.code, result.out) == (0, f"ffff (newer than this modtrace; upgrade modtrace; this modtrace's head is {HEAD})\n")


@pytest.fixture
def newer_modtrace(monkeypatch: pytest.MonkeyPatch) -> str:
    """Make this modtrace believe it knows one more revision than the database
    has, so a database at the real head is 'older'.  Only the version check
    sees the extra revision; the CLI path around it is the real one."""
    import modtrace.store.base as engine_mod
    import modtrace.store.schema as schema_mod

    future = "9999"
    revisions = (*schema_mod.REVISIONS, future)
    for mod in (engine_mod, schema_mod):
        monkeypatch.setattr(mod, "REVISIONS", revisions)
        monkeypatch.setattr(mod, "HEAD", future)
    return future


@pytest.mark.parametrize("command", [c for c in READ_COMMANDS if c != ("db", "current")],
                         ids=[i for i in READ_IDS if i != "db-current"])
def test_older_revision_tells_user_to_run_db_upgrade(run_cli, any_db: str, digest, newer_modtrace: str, command) -> None:  # type: ignore[no-untyped-def]
    import modtrace.store.migrate as migrate_mod

    # create at the real head, bypassing the patched check
    from modtrace.store.engine import Store, _pg_engine, _sqlite_engine

    if "://" in any_db:
        store = Store(engine=_pg_engine(any_db), label=any_db, path=None)
    else:
        store = Store(engine=_sqlite_engine(Path(any_db)), label=any_db, path=Path(any_db))
    try:
        migrate_mod.upgrade(store, revision=HEAD)
    finally:
        store.dispose()
    label = str(any_db) if "://" not in any_db else sa.make_url(any_db).render_as_string(hide_password=True)
    before = digest(Path(any_db)) if "://" not in any_db else None
    _one_error_line(
        run_cli(*command, "--db", any_db),
        f"{label} uses schema revision {HEAD}, older than this modtrace's {newer_modtrace}; "
        f"run `modtrace db upgrade --db {label}`",
    )
    if before is not None:
        assert digest(Path(any_db)) == before
    current = run_cli("db", "current", "--db", any_db)
    assert current.out == f"{HEAD} (behind head; run `modtrace db upgrade`; this modtrace's head is {newer_modtrace})\n"


# --- usage errors, connection failures, --debug ---------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nosuch",), "No such command 'nosuch'."),
        (("runs", "--format", "xml"), "Invalid value for '--format': 'xml' is not one of 'table', 'json', 'csv'."),
        (("runs", "--limit", "0"), "Invalid value for '--limit': 0 is not in the range x>=1."),
        (("db", "upgrade", "--db", "sqlite://"), "an in-memory SQLite database cannot hold a recording; give a file path"),
    ],
    ids=["unknown-command", "bad-format", "bad-limit", "in-memory"],
)
def test_usage_errors_exit_2_on_one_line(run_cli, args, message: str) -> None:  # type: ignore[no-untyped-def]
    _one_error_line(run_cli(*args), message, code=2)


def test_unknown_url_scheme_is_a_usage_error(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("runs", "--db", "nosuchdialect://host/db")
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("modtrace: error: invalid database URL 'nosuchdialect://host/db'")
    assert result.err.count("\n") == 1


def test_unreachable_postgres_fails_on_one_line_without_the_password(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("runs", "--db", "postgresql+psycopg://someone:s3cret@127.0.0.1:1/nowhere")
    assert result.code == 1 and result.out == ""
    assert result.err.startswith("modtrace: error: cannot connect to postgresql+psycopg://someone:***@127.0.0.1:1/nowhere: ")
    assert result.err.count("\n") == 1
    assert "s3cret" not in result.err


def test_debug_adds_the_traceback(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "missing.db"
    plain = run_cli("runs", "--db", str(path))
    assert "Traceback" not in plain.err
    debug = run_cli("--debug", "runs", "--db", str(path))
    assert debug.code == 1
    assert debug.err.startswith("Traceback (most recent call last):")
    assert debug.err.endswith(f"modtrace: error: no modtrace database at {path} (record a run first, or pass --db)\n")


def test_real_process_prints_one_line_and_exit_codes(tmp_path: Path, digest) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "notes.db"
    path.write_text("plain text\n")
    before = digest(path)

    def modtrace(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "modtrace", *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=60)

    refused = modtrace("db", "upgrade", "--db", str(path))
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == f"modtrace: error: {path} is not a SQLite database; refusing to touch it\n"
    assert digest(path) == before
    usage = modtrace("runs", "--format", "xml")
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1 and "Traceback" not in usage.stderr
    version = modtrace("--version")
    assert (version.returncode, version.stdout.startswith("modtrace, version ")) == (0, True)
