"""Faults while recording: nothing written is lost, the run says what happened."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import modtrace
from tests.helpers.harness import tmpfs


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB filesystem (tmpfs), to fill up."""
    with tmpfs(tmp_path / "small", "1m") as mnt:
        yield mnt


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_disk_full_during_a_flush_marks_the_run_failed_and_keeps_what_was_written(
    small_disk: Path, capfd: pytest.CaptureFixture[str], writer: str
) -> None:
    db = small_disk / "full.db"
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(50)])
    with modtrace.Recorder(db=str(db), run="full", flush_every=2_000, analyze=False, writer=writer) as rec:
        for _ in range(600):
            model(torch.randn(2, 4)).sum().backward()
            rec.step()
    err = capfd.readouterr().err
    assert "database or disk is full" in err
    assert rec.status == "failed"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        status, error = conn.execute("SELECT status, error FROM runs").fetchone()
        assert status == "failed"
        assert "database or disk is full" in error and "not written" in error
        written = conn.execute("SELECT COUNT(*) FROM event_log").fetchone()[0]
    finally:
        conn.close()
    assert written == rec._written and written > 0
    assert written < rec.events_recorded + rec._dropped
