"""The golden-file check itself: it can only pass on a match where CI runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.golden import check_golden


def test_ci_compares_golden_files_even_when_asked_to_update_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "out.txt").write_text("expected\n")
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("MODTRACE_UPDATE_GOLDEN", "1")
    with pytest.raises(AssertionError):
        check_golden("out.txt", "changed\n", directory=tmp_path)
    assert (tmp_path / "out.txt").read_text() == "expected\n"
    check_golden("out.txt", "expected\n", directory=tmp_path)


def test_update_rewrites_a_changed_golden_file_outside_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "out.txt").write_text("expected\n")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("MODTRACE_UPDATE_GOLDEN", "1")
    check_golden("out.txt", "changed\n", directory=tmp_path)
    assert (tmp_path / "out.txt").read_text() == "changed\n"
    monkeypatch.delenv("MODTRACE_UPDATE_GOLDEN")
    with pytest.raises(AssertionError):
        check_golden("out.txt", "other\n", directory=tmp_path)
