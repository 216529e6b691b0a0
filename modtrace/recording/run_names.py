"""Run names: the default ``<script>-<start time>``, and the one name every
rank of a distributed launch derives identically."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from modtrace.core.errors import UsageError

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)


def default_run_name(stem: str, when: datetime) -> str:
    """``<script or module>-<local start time>``, e.g. ``train_tiny-20260131-142501``."""
    return f"{stem}-{when:%Y%m%d-%H%M%S}"


def world_size_from_env(env: Mapping[str, str]) -> int:
    try:
        return max(1, int(env.get("WORLD_SIZE") or 1))
    except ValueError:
        return 1


def shared_run_name(stem: str, env: Mapping[str, str], launcher_pid: int) -> str | None:
    """A run name every rank of one distributed launch derives identically; None when not distributed.

    The ranks of one launch cannot agree on a start time, so the name comes
    from what they share: torchrun's rendezvous id (a fresh uuid for every
    single-node launch without --master-port, and for --standalone), else, when all ranks
    run on this host, the launcher process (their common parent) and its
    start time.  A multi-node launch with neither must be given --run.
    """
    if world_size_from_env(env) <= 1:
        return None
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return f"{stem}-{run_id[:8] if _UUID.match(run_id) else run_id}"
    if env.get("LOCAL_WORLD_SIZE") == env.get("WORLD_SIZE"):
        started = process_start_time(launcher_pid)
        if started is not None:
            return f"{stem}-{started:%Y%m%d-%H%M%S}-{launcher_pid}"
    raise UsageError(
        "the ranks of this distributed launch need one shared run name: "
        "pass --run-name NAME (or launch torchrun with --rdzv-id ID)"
    )


def process_start_time(pid: int) -> datetime | None:
    """When process ``pid`` started (Linux /proc), or None when that cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # Field 22 (starttime, clock ticks after boot); the command name in
        # field 2 may contain spaces, so count from its closing parenthesis.
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        btime = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
        )
        return datetime.fromtimestamp(btime + ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


