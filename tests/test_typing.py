"""Strict mypy over the whole package, the CLI and the renderers included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_mypy_is_strict_over_the_whole_package() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["files"] == ["modtrace"] and config["strict"] is True
    assert "overrides" not in config  # no module is let off
    mypy = Path(sys.executable).parent / "mypy"
    if not mypy.exists():
        pytest.skip("mypy is not installed (it comes with the dev extra)")
    proc = subprocess.run([str(mypy)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("Success")
