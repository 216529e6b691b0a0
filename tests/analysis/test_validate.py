"""Analysis validates its input: hand-edited or foreign rows in ``events``
become precise nesting issues naming their seq, never an internal error;
every command answers in one clear line or a report, and read commands
leave the database file as it was."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from tests.helpers.recording import FakeClock
from tests.helpers.training import record_training


def record_small(db: Path, run: str = "r", steps: int = 2) -> None:
    """A Linear and a ReLU on a fixed input: the events whose seqs the corruptions below name."""
    record_training(str(db), run, steps, model=lambda: nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
                    inputs=lambda _: torch.ones(2, 4), lr=0.1, clock=FakeClock())


def corrupt(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db)
    for sql in statements:
        conn.execute(sql)
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def one_line_or_report(result: Any) -> None:
    assert result.code in (0, 1), result
    assert "Traceback" not in result.err and "--debug" not in result.err, result
    errors = [line for line in result.err.splitlines() if line.startswith("modtrace: error")]
    assert len(errors) <= 1 and (result.code == 0 or errors or result.out), result


def test_each_bad_row_is_an_issue_naming_its_seq(db_path: Path, run_cli: Any) -> None:
    record_small(db_path)
    corrupt(db_path,
            "UPDATE events SET phase = 77 WHERE seq = 2",
            "UPDATE events SET status = 42 WHERE seq = 3",
            "UPDATE events SET module_id = 999 WHERE seq = 4",
            "UPDATE events SET ts_ns = -5 WHERE seq = 5",
            "UPDATE events SET kind = 9 WHERE seq = 6",
            "DELETE FROM events WHERE seq IN (10, 11)",
            "UPDATE events SET ts_ns = 1 WHERE seq = 15")
    rebuilt = run_cli("analyze", "r")  # the stored analysis predates the edits
    assert rebuilt.code in (0, 1) and "Traceback" not in rebuilt.err, rebuilt
    result = run_cli("check", "r", "--format", "json")
    assert result.code == 1, result
    import json

    issues = json.loads(result.out)
    by_seq = {(i["seq"], i["kind"]): i for i in issues}
    for seq, what in ((2, "unknown phase code 77"), (3, "unknown status code 42"), (4, "module_id 999 has no modules row"),
                      (5, "negative ts_ns -5"), (6, "unknown kind code 9")):
        issue = by_seq[(seq, "invalid_row")]
        assert issue["severity"] == "error" and what in issue["message"] and f"seq {seq}" in issue["message"], issue
    gap = by_seq[(12, "seq_gap")]
    assert gap["severity"] == "warning" and "seq 10 to 11 missing" in gap["message"]
    assert by_seq[(15, "time_reversed")]["severity"] == "warning"
    for args in (("tree", "r"), ("export", "r", "-o", "-")):
        out = run_cli(*args)
        assert out.code in (0, 1) and "Traceback" not in out.err and "IndexError" not in out.err, (args, out)


def test_a_clean_run_gets_no_validation_issue(db_path: Path, run_cli: Any) -> None:
    record_small(db_path)
    assert run_cli("check", "r").code == 0


COLUMNS = st.sampled_from(["kind", "phase", "status", "module_id", "ts_ns", "thread_id", "step", "delete"])
VALUES = st.one_of(st.integers(-3, 3), st.integers(-(2**40), 2**40), st.sampled_from([77, 42, 127, -128, 999]))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(COLUMNS, st.integers(0, 40), VALUES), min_size=1, max_size=4))
def test_random_corruptions_never_crash_a_command_and_reads_change_nothing(
    edits: list[tuple[str, int, int]], tmp_path: Path, run_cli: Any, digest: Any,
) -> None:
    pristine = tmp_path / "pristine.db"
    if not pristine.exists():
        record_small(pristine)
        record_small(pristine, "base")
        corrupt(pristine)
    db = tmp_path / "work.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    shutil.copy(pristine, db)
    statements = []
    for column, seq, value in edits:
        if column == "delete":
            statements.append(f"DELETE FROM events WHERE run_id = 1 AND seq = {seq}")
        else:
            statements.append(f"UPDATE events SET {column} = {value} WHERE run_id = 1 AND seq = {seq}")
    try:
        corrupt(db, *statements)
    except sqlite3.IntegrityError:
        return  # the schema itself refused the edit: nothing to analyse
    one_line_or_report(run_cli("analyze", "r", "--db", str(db)))
    before = digest(db)
    for args in (("check", "r"), ("tree", "r"), ("export", "r", "-o", "-"), ("diff", "base", "r"), ("show", "r")):
        result = run_cli(*args, "--db", str(db))
        one_line_or_report(result)
        assert digest(db) == before, args
