"""The recorder's settings and small helpers: batch sizes and intervals, the
writer choices, the run's default name and rank, a batch of taken events."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from modtrace.core.contracts import Batch
from modtrace.core.step_ranges import ranges
from modtrace.recording.run_names import default_run_name, shared_run_name
from modtrace.recording.writer_messages import unpack_batch

DEFAULT_FLUSH_EVERY = 20_000
FLUSH_INTERVAL_S = 1.0
POLL_S = 0.1
# With a writer process, smaller batches go as soon as this many events wait
# (checked every POLL_S): handing one over costs the program only the
# packing, and the final flush, which the program waits for, is then short.
EAGER_BATCH = 4096
# While the writer process starts (docs/performance.md, "Writer process and event writes"),
# batches wait for it rather
# than being written by the program for a while and then not: the program's
# timing stays the same from the first step to the last.  Up to this long,
# and up to flush_every events.
WRITER_START_WAIT_S = 5.0
WRITERS = ("auto", "process", "thread", "inline")
# While the database is unreachable events wait in memory; beyond this many
# (about 250 bytes each), whole steps are dropped at step boundaries and the
# run says which (run_ranks.dropped_steps).
MAX_BUFFERED_EVENTS = 1_000_000

__all__ = ["ranges"]  # re-exported for the recorder's modules


@dataclass
class PendingBatch:
    """A batch taken from the buffers, not yet written.

    Once packed for the writer process (``packed``) it keeps only the
    frame: its event tuples are freed at once, while the step that made
    them is still in the caches (freed a step later, when the writer's
    answer comes, they cost the program several times as much:
    docs/performance.md, "Recorder hot path"), and a
    waiting batch holds its 31 bytes an event rather than some 250.
    ``rows`` unpacks it again if this process must write the batch itself."""

    batch: Batch | None  # None once packed (see ``rows``)
    frame: bytes | None = None  # packed for the writer process
    progress: tuple[int, int] = field(init=False)  # (event_count, step_count) once this batch is written
    count: int = field(init=False)  # its events

    def __post_init__(self) -> None:
        assert self.batch is not None and self.batch.progress is not None
        self.progress = self.batch.progress
        self.count = len(self.batch.events)

    def packed(self, frame: bytes) -> None:
        """Keep ``frame`` (the whole batch, packed) instead of the batch."""
        self.frame = frame
        self.batch = None

    def rows(self) -> Batch:
        """The batch (unpacked from its frame after ``packed``)."""
        if self.batch is None:
            assert self.frame is not None
            return unpack_batch(self.frame)
        return self.batch


def dist_rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # pragma: no cover - a broken distributed setup still records rank 0
        pass
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def recorder_run_name(world_size: int) -> str:
    """The default name of a run recorded from Python: the program's name and
    start time, or for ranks of one launch the name they all derive."""
    stem = Path(sys.argv[0] or "python").stem or "python"
    if world_size > 1:
        shared = shared_run_name(stem, os.environ, os.getppid())
        if shared is not None:
            return shared
    return default_run_name(stem, datetime.now())


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def drain(rows: list[Any]) -> list[Any]:
    n = len(rows)
    out = rows[:n]
    del rows[:n]
    return out


def torch_version() -> str | None:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "")) or None


def summary(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
