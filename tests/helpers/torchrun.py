"""Launching a script under ``torchrun ... -m modtrace record``: real processes, 2 ranks over gloo on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.ports import free_port


def torchrun_record(tmp_path: Path, script: str, source: str, db: str, run: str,
                    *args: str) -> subprocess.CompletedProcess[str]:
    """Write ``source`` to ``tmp_path / script`` and record it as ``run`` in ``db`` under torchrun
    with 2 ranks on this machine (one intra-op thread each: the ranks share its CPUs), passing it
    ``args``; the finished launcher (the caller asserts on its return code)."""
    path = tmp_path / script
    path.write_text(source)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "modtrace", "record", "--db", db, "--run-name", run, "-q",
           str(path), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
