"""modtrace: record the nn.Module hierarchy of PyTorch programs and analyse it offline.

``modtrace.Recorder`` records into a database; ``modtrace.open(db)`` reads
it back as polars frames (``modtrace.api``); ``modtrace.ModuleTracker`` is a
drop-in replacement for ``torch.utils.module_tracker.ModuleTracker``;
``modtrace.schedule(...)`` chooses which steps a ``Recorder`` records.  All are
imported lazily so that ``import modtrace`` (and the CLI) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from modtrace._version import __version__

if TYPE_CHECKING:
    from modtrace.api import open
    from modtrace.recording.recorder import Recorder
    from modtrace.recording.schedule import schedule
    from modtrace.tracking.module_tracker import ModuleTracker

__all__ = ["ModuleTracker", "Recorder", "__version__", "open", "schedule"]


def __getattr__(name: str) -> Any:
    if name == "Recorder":
        from modtrace.recording.recorder import Recorder

        return Recorder
    if name == "ModuleTracker":
        from modtrace.tracking.module_tracker import ModuleTracker

        return ModuleTracker
    if name == "schedule":
        from modtrace.recording.schedule import schedule

        return schedule
    if name == "open":
        from modtrace.api import open

        return open
    raise AttributeError(f"module 'modtrace' has no attribute {name!r}")
