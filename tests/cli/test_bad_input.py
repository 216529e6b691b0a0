"""Bad input, every command: the exact one-line message, the exit code, and
the database (and its directory) left exactly as it was.

What other files already cover, this one does not repeat:

- missing, empty, directory, non-SQLite, foreign SQLite, newer and older
  revisions for runs/show/db (both backends): tests/test_cli_db.py;
- malformed --tag, script not found, module not importable on a fresh
  database (nothing created): tests/test_cli_record.py;
- malformed --param and other query usage errors: tests/test_query_cli.py;
- disk full through the Python API: tests/test_reliability.py.

Here the same refusals reach every other command (record, analyze, tree,
check, diff, query, export, report), an existing database is shown to be
byte-identical afterwards, and run references cover unknown, ambiguous and
hostile names.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from modtrace.store.schema import HEAD
from tests.helpers.harness import tmpfs

REPO = Path(__file__).resolve().parents[2]

# Three optimizer steps through a small model: enough for tree, check, diff and export.
TARGET = textwrap.dedent(
    """
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
    print("target ran")
    """
)


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` with the sha256 of its bytes: unchanged means same names, same bytes.

    Left out: SQLite's shared-memory index (``-shm``, never data) and an
    empty write-ahead log, which a read-only reader of a WAL database may
    leave behind; a WAL holding data would count.
    """
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.endswith("-shm") and not (p.name.endswith("-wal") and p.stat().st_size == 0)
    }


def fqns(nodes: list[dict[str, object]]) -> set[str]:
    """Module names in a tree of ``modtrace tree --format json``."""
    out: set[str] = set()
    for node in nodes:
        out.add(str(node["fqn"]))
        out |= fqns(node["children"])  # type: ignore[arg-type]
    return out


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with the target script; databases live elsewhere (``dbdir``)."""
    d = tmp_path / "work"
    d.mkdir()
    (d / "target.py").write_text(TARGET)
    monkeypatch.chdir(d)
    return d


@pytest.fixture
def dbdir(tmp_path: Path) -> Path:
    d = tmp_path / "dbs"
    d.mkdir()
    return d


def commands(db: str, out: Path) -> dict[str, list[str]]:
    """Every command that opens a database, with the arguments it needs."""
    return {
        "record": ["record", "--db", db, "-q", "target.py"],
        "runs": ["runs", "--db", db],
        "show": ["show", "@", "--db", db],
        "analyze": ["analyze", "@", "--db", db],
        "tree": ["tree", "@", "--db", db],
        "check": ["check", "@", "--db", db],
        "diff": ["diff", "@", "@", "--db", db],
        "query": ["query", "SELECT 1", "--db", db],
        "export": ["export", "@", "-o", str(out / "trace.json"), "--db", db],
        "report": ["report", "@", "-o", str(out / "report.html"), "--db", db],
        "delete": ["delete", "@", "--yes", "--db", db],
        "db-current": ["db", "current", "--db", db],
        "db-check": ["db", "check", "--db", db],
        "db-upgrade": ["db", "upgrade", "--db", db],
    }


READERS = ["runs", "show", "analyze", "tree", "check", "diff", "query", "export", "report", "delete", "db-current",
           "db-check"]
ALL = ["record", *READERS, "db-upgrade"]


def assert_refused(res, message: str, code: int = 1) -> None:  # type: ignore[no-untyped-def]
    assert (res.code, res.out) == (code, ""), res
    assert res.err == f"modtrace: error: {message}\n"


# --- databases that cannot be used -------------------------------------------------------


@pytest.mark.parametrize("command", READERS)
def test_missing_database_is_not_created(run_cli, work: Path, dbdir: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    path = dbdir / "absent.db"
    res = run_cli(*commands(str(path), dbdir)[command])
    assert_refused(res, f"no modtrace database at {path} (record a run first, or pass --db)")
    assert snapshot(dbdir) == {}


@pytest.mark.parametrize("command", ALL)
def test_directory_is_refused(run_cli, work: Path, dbdir: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    path = dbdir / "adir"
    path.mkdir()
    res = run_cli(*commands(str(path), dbdir)[command])
    assert_refused(res, f"{path} is a directory, not a database file")
    assert list(path.iterdir()) == [] and [p.name for p in dbdir.iterdir()] == ["adir"]


@pytest.mark.parametrize("command", ALL)
def test_non_sqlite_file_is_refused_untouched(run_cli, work: Path, dbdir: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    path = dbdir / "notes.db"
    path.write_bytes(b"meeting notes, not a database\n" + bytes(range(256)) * 4)
    before = snapshot(dbdir)
    res = run_cli(*commands(str(path), dbdir)[command])
    assert_refused(res, f"{path} is not a SQLite database; refusing to touch it")
    assert snapshot(dbdir) == before


@pytest.mark.parametrize("command", ALL)
def test_other_applications_sqlite_is_refused_untouched(run_cli, work: Path, dbdir: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    path = dbdir / "browser.db"
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE history (id INTEGER PRIMARY KEY, url TEXT)")
        conn.execute("INSERT INTO history (url) VALUES ('https://example.org')")
    conn.close()
    before = snapshot(dbdir)
    res = run_cli(*commands(str(path), dbdir)[command])
    assert_refused(res, f"{path} is a SQLite database of another application (no modtrace schema); refusing to touch it")
    assert snapshot(dbdir) == before


DIGIT_RUN = textwrap.dedent(
    """
    import sys, torch, modtrace
    model = torch.nn.Linear(4, 2)
    with modtrace.Recorder(db=sys.argv[1], run="2") as rec:
        for _ in range(2):
            model(torch.ones(1, 4)).sum().backward()
            rec.step()
    assert rec.run_id == 3
    """
)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Recorded once per module, copied per test: runs 1 'baseline' and 2
    'second' (from the CLI) and 3 named '2' (from Python, which allows a name of digits)."""
    d = tmp_path_factory.mktemp("template")
    (d / "target.py").write_text(TARGET)
    (d / "digit.py").write_text(DIGIT_RUN)
    path = d / "trace.db"
    for name in ("baseline", "second"):
        subprocess.run([sys.executable, "-m", "modtrace", "record", "--db", str(path), "--run", name, "-q", "target.py"],
                       cwd=d, check=True, capture_output=True, timeout=120)
    subprocess.run([sys.executable, "digit.py", str(path)], cwd=d, check=True, capture_output=True, timeout=120)
    return path


@pytest.fixture
def recorded(template: Path, dbdir: Path) -> Path:
    """A copy of the template database in ``dbdir``."""
    path = dbdir / "trace.db"
    shutil.copyfile(template, path)
    return path


@pytest.mark.parametrize("command", ALL)
def test_newer_schema_revision_is_refused_untouched(run_cli, work: Path, dbdir: Path, recorded: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    conn = sqlite3.connect(recorded)
    with conn:
        conn.execute("UPDATE alembic_version SET version_num = 'ffff'")
    conn.close()
    before = snapshot(dbdir)
    res = run_cli(*commands(str(recorded), dbdir)[command])
    if command == "db-current":
        assert (res.code, res.out) == (0, f"ffff (newer than this modtrace; upgrade modtrace; this modtrace's head is {HEAD})\n")
    else:
        assert_refused(res, f"{recorded} uses schema revision ffff, newer than this modtrace knows (head {HEAD}); upgrade modtrace")
    assert snapshot(dbdir) == before


@pytest.mark.parametrize("command", [c for c in ALL if c != "db-upgrade"])
def test_older_schema_revision_asks_for_db_upgrade(run_cli, work: Path, dbdir: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    path = dbdir / "old.db"
    shutil.copyfile(REPO / "tests" / "data" / "frozen" / "0001.db", path)  # a real database of revision 0001
    before = snapshot(dbdir)
    res = run_cli(*commands(str(path), dbdir)[command])
    if command == "db-current":
        assert (res.code, res.out) == (0, f"0001 (behind head; run `modtrace db upgrade`; this modtrace's head is {HEAD})\n")
    else:
        assert_refused(res, f"{path} uses schema revision 0001, older than this modtrace's {HEAD}; "
                            f"run `modtrace db upgrade --db {path}`")
    assert snapshot(dbdir) == before


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a filesystem mounted read-only (root ignores file modes; a read-only mount it cannot)."""
    with tmpfs(tmp_path / "ro", "4m") as mnt:
        yield mnt


def test_read_only_database_is_refused_by_record_and_still_readable(run_cli, work: Path, read_only_dir: Path) -> None:  # type: ignore[no-untyped-def]
    path = read_only_dir / "trace.db"
    assert run_cli("record", "--db", str(path), "--run", "baseline", "-q", "target.py").code == 0
    subprocess.run(["mount", "-o", "remount,ro", str(read_only_dir)], check=True)
    before = snapshot(read_only_dir)
    res = run_cli("record", "--db", str(path), "--run", "again", "-q", "target.py")
    assert_refused(res, f"{path} is read-only; cannot record into it")
    assert snapshot(read_only_dir) == before
    # Reading still works.
    shown = run_cli("show", "baseline", "--db", str(path), "--format", "json")
    assert shown.code == 0, shown
    assert json.loads(shown.out)["status"] == "completed"
    assert snapshot(read_only_dir) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to files whatever their mode (see the read-only mount test)")
def test_read_only_file_mode_is_refused_by_record(run_cli, work: Path, recorded: Path, dbdir: Path) -> None:  # type: ignore[no-untyped-def]
    recorded.chmod(0o444)
    before = snapshot(dbdir)
    assert_refused(run_cli("record", "--db", str(recorded), "-q", "target.py"), f"{recorded} is read-only; cannot record into it")
    assert snapshot(dbdir) == before


# --- run references ----------------------------------------------------------------------


RUN_COMMANDS = ["show", "analyze", "tree", "check", "diff", "export", "report", "query"]


def run_command(name: str, ref: str, db: Path, out: Path) -> list[str]:
    return {
        "show": ["show", ref, "--db", str(db)],
        "analyze": ["analyze", ref, "--db", str(db)],
        "tree": ["tree", ref, "--db", str(db)],
        "check": ["check", ref, "--db", str(db)],
        "diff": ["diff", ref, ref, "--db", str(db), "--skip-steps", "0"],
        "export": ["export", ref, "-o", str(out / "trace.json"), "--db", str(db), "-q"],
        "report": ["report", ref, "-o", str(out / "report.html"), "--db", str(db), "-q"],
        "query": ["query", "top_self_time", "--run", ref, "--db", str(db)],
    }[name]


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_unknown_run_suggests_close_names(run_cli, work: Path, dbdir: Path, recorded: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    before = snapshot(dbdir)
    res = run_cli(*run_command(command, "basline", recorded, dbdir))
    assert_refused(res, f"no run 'basline' in {recorded}; did you mean 'baseline'?", code=2)
    far = run_cli(*run_command(command, "zzz", recorded, dbdir))
    assert_refused(far, f"no run 'zzz' in {recorded}", code=2)
    assert snapshot(dbdir) == before


@pytest.fixture
def digit_named(recorded: Path) -> Path:
    return recorded


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_digits_naming_one_run_and_numbering_another_are_refused_as_ambiguous(run_cli, dbdir: Path, digit_named: Path, command: str) -> None:  # type: ignore[no-untyped-def]
    before = snapshot(dbdir)
    res = run_cli(*run_command(command, "2", digit_named, dbdir))
    assert_refused(res, "run reference '2' is ambiguous: run named '2' (id 3) and run id 2 (named 'second'); "
                        "write name:2 or id:2", code=2)
    assert snapshot(dbdir) == before


def test_explicit_name_and_id_references(run_cli, dbdir: Path, digit_named: Path) -> None:  # type: ignore[no-untyped-def]
    def shown(ref: str) -> tuple[int, str]:
        res = run_cli("show", ref, "--db", str(digit_named), "--format", "json")
        assert res.code == 0, res
        info = json.loads(res.out)
        return info["id"], info["name"]

    assert shown("name:2") == (3, "2")
    assert shown("id:2") == (2, "second")
    assert shown("id:3") == (3, "2")
    assert shown("name:second") == (2, "second")
    assert shown("1") == (1, "baseline")  # digits that only number a run are its id
    assert shown("3") == (3, "2")  # digits that name and number the same run are that run
    before = snapshot(dbdir)
    assert_refused(run_cli("show", "id:9", "--db", str(digit_named)), f"no run with id 9 in {digit_named}", code=2)
    assert_refused(run_cli("show", "id:two", "--db", str(digit_named)),
                   "run reference 'id:two': id: takes a number, e.g. id:3", code=2)
    assert_refused(run_cli("show", "name:1", "--db", str(digit_named)), f"no run '1' in {digit_named}", code=2)
    # In diff, RUN:RANK still splits after an explicit form.
    res = run_cli("diff", "id:2:0", "name:second:0", "--db", str(digit_named), "--skip-steps", "0", "--format", "json")
    assert res.code == 0, res
    doc = json.loads(res.out)
    assert (doc["base"]["run"], doc["base"]["rank"], doc["cand"]["run"]) == ("second", 0, "second")
    assert snapshot(dbdir) == before


HOSTILE_NAMES = [
    "x'; DROP TABLE runs; --",
    'say "hi"',
    "Robert'); DELETE FROM events WHERE ('1' = '1",
    "naïve Lauf 名前 ☃",
    "%s %(x)s ? :run_id $1",
    "ckpt:3",
    "back\\slash",
]


def test_hostile_run_names_record_and_resolve_everywhere(run_cli, work: Path, dbdir: Path) -> None:  # type: ignore[no-untyped-def]
    db = dbdir / "names.db"
    for name in HOSTILE_NAMES:
        res = run_cli("record", "--db", str(db), "--run", name, "-q", "target.py")
        assert res.code == 0, (name, res)
    listed = json.loads(run_cli("runs", "--db", str(db), "--format", "json").out)
    assert [r["name"] for r in reversed(listed)] == HOSTILE_NAMES
    assert all(r["status"] == "completed" and r["events"] > 0 for r in listed)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        per_run = dict(conn.execute("SELECT run_id, count(*) FROM events GROUP BY run_id").fetchall())
    finally:
        conn.close()
    assert len(per_run) == len(HOSTILE_NAMES) and len(set(per_run.values())) == 1  # no statement ran, nothing deleted

    for run_id, name in enumerate(HOSTILE_NAMES, start=1):
        for ref in (name, f"name:{name}"):
            shown = run_cli("show", ref, "--db", str(db), "--format", "json")
            assert shown.code == 0, (ref, shown)
            assert (json.loads(shown.out)["id"], json.loads(shown.out)["name"]) == (run_id, name)
        for command in RUN_COMMANDS:
            res = run_cli(*run_command(command, name, db, dbdir))
            assert res.code == 0, (name, command, res)
        analysed = run_cli("analyze", name, "--db", str(db))
        assert analysed.out.startswith(f"run {name} (id {run_id}): ")
        tree = json.loads(run_cli("tree", name, "--db", str(db), "--format", "json").out)
        assert fqns(tree) == {"Sequential", "Sequential.0", "Sequential.1", "Sequential.2"}
    # A typo of a hostile name is quoted back exactly, with the suggestion.
    res = run_cli("show", "x'; DROP TABLE run; --", "--db", str(db))
    assert_refused(res, f"no run \"x'; DROP TABLE run; --\" in {db}; did you mean \"x'; DROP TABLE runs; --\"?", code=2)


# --- malformed options and targets on an existing database --------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["record", "--tag", "novalue", "target.py"], "--tag expects KEY=VALUE, got 'novalue'"),
        (["record", "--tag", "=v", "target.py"], "--tag expects KEY=VALUE, got '=v'"),
        (["record", "--tag", "k=1", "--tag", "k=2", "target.py"], "--tag k given twice"),
        (["record", "--run", "baseline", "target.py"],
         "a run named 'baseline' already exists in {db}; choose another --run name"),
        (["record", "--run", "7", "target.py"], "--run '7': a name cannot be all digits (RUN references read digits as ids)"),
        (["record", "missing.py"], "script not found: missing.py"),
        (["record", "-m", "no_such_module_xyz"], "no module named no_such_module_xyz"),
        (["record", "-m", "json.no_such_sub"], "no module named json.no_such_sub"),
        (["query", "top_self_time", "--run", "baseline", "-p", "limit"], "--param wants KEY=VALUE, got 'limit'"),
        (["query", "top_self_time", "--run", "baseline", "-p", "=3"], "--param wants KEY=VALUE, got '=3'"),
    ],
    ids=["tag-no-equals", "tag-no-key", "tag-twice", "run-taken", "run-digits", "script-missing", "module-missing",
         "submodule-missing", "param-no-equals", "param-no-key"],
)
def test_usage_errors_leave_an_existing_database_unchanged(run_cli, work: Path, dbdir: Path, recorded: Path, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    before = snapshot(dbdir)
    res = run_cli(args[0], "--db", str(recorded), *args[1:])
    assert_refused(res, message.format(db=recorded), code=2)
    assert snapshot(dbdir) == before


# --- disk full through the command line -------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB filesystem (tmpfs), to fill up."""
    with tmpfs(tmp_path / "small", "1m") as mnt:
        yield mnt


FILLER = textwrap.dedent(
    """
    import torch
    from torch import nn

    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(50)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(120):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    print("target finished")
    """
)


def test_disk_full_from_the_command_line(work: Path, small_disk: Path) -> None:
    (work / "filler.py").write_text(FILLER)
    db = small_disk / "full.db"
    proc = subprocess.run([sys.executable, "-m", "modtrace", "record", "--db", str(db), "--run", "full", "filler.py"],
                          cwd=work, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.splitlines()
    stop = (f"modtrace: error: writing events to {db} failed: database or disk is full; "
            "recording stopped (run 'full' will be marked failed)")
    assert lines[0] == stop, proc.stderr
    assert proc.stdout == "target finished\n"  # the program itself goes on
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        status, error = conn.execute("SELECT status, error FROM runs WHERE name = 'full'").fetchone()
        written = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        counted = conn.execute("SELECT event_count FROM run_ranks").fetchone()[0]
    finally:
        conn.close()
    assert status == "failed"
    assert error.startswith(f"writing events to {db} failed: database or disk is full; ") and error.endswith(" event(s) not written")
    assert written == counted > 0
    # The program succeeded, so the exit code is its own; the summary says the recording failed.
    assert proc.returncode == 0
    assert re.fullmatch(r"modtrace: run 'full' \(id 1\) failed \(recording stopped by a write error; the program "
                        r"itself completed\): [\d,]+ events, 120 steps", lines[-1]), proc.stderr
    assert len(lines) == 2
