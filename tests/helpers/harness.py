"""Test harness pieces shared by several test files: our own count of module
calls, and small real filesystems to fill up or make read-only."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from modtrace.core.contracts import Batch
from modtrace.store.engine import Store
from modtrace.store.writer import RankWriter


@contextmanager
def counted_calls() -> Iterator[list[int]]:
    """The program's own count of module calls (forward), by a global hook of ours."""
    count = [0]

    def hook(module: nn.Module, args: Any, out: Any) -> None:
        count[0] += 1

    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (e.g. "1m") mounted at ``path``; skipped where mounting is not allowed, failed under CI."""
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot mount a tmpfs: {proc.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def update_rank_progress(store: Store, run_id: int, rank: int, event_count: int, step_count: int) -> None:
    """What the recorder's writer records with each batch: the rank's event and step counts."""
    writer = RankWriter(store, run_id, rank)
    try:
        writer.write(Batch([], progress=(event_count, step_count)))
    finally:
        writer.close()
