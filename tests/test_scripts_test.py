"""``./scripts/test``: the PostgreSQL tests run whenever a server answers on 127.0.0.1:5432, and
the run's last line says what was skipped and why.

The script runs from a copy of the repository's skeleton (scripts, pyproject.toml,
constraints.txt, tests) whose ``.venv`` is already "installed": its python is this interpreter
and its install stamp is current, so the script installs nothing and runs the real tests.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SELECTION = ("tests/store/test_store.py", "-k", "batches_of_any_size and 63", "-p", "no:cacheprovider")


def _pg_answers() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
    except OSError:
        return False
    return True


def _skeleton(root: Path) -> Path:
    root.mkdir()
    for name in ("pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "scripts", root / "scripts")
    (root / "tests").symlink_to(REPO / "tests")
    venv = root / ".venv" / "bin"
    venv.mkdir(parents=True)
    for tool in ("python", "modtrace"):
        (venv / tool).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (venv / tool).chmod(0o755)
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "constraints.txt"):
        digest.update((root / name).read_bytes())
    (root / ".venv" / ".modtrace-install").write_text(digest.hexdigest() + "\n")
    return root


@pytest.mark.skipif(not _pg_answers(), reason="no PostgreSQL server on 127.0.0.1:5432")
def test_scripts_test_finds_postgresql_and_ends_with_what_it_skipped(tmp_path: Path) -> None:
    root = _skeleton(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items() if k not in ("MODTRACE_TEST_PG_URL", "CI")}
    env["PYTHONPATH"] = str(REPO)  # the package under test, as for every test here
    proc = subprocess.run([str(root / "scripts" / "test"), *SELECTION], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.rstrip("\n").splitlines()
    assert "2 passed" in lines[-2], lines[-3:]  # the SQLite and the PostgreSQL variant both ran
    assert lines[-1] == "skipped: none", lines[-3:]
