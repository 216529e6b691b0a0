"""``modtrace.Recorder``, the public entry of a recording (defined in ``modtrace.recording.recorder``)."""

from __future__ import annotations

from modtrace.recording.config import (
    DEFAULT_FLUSH_EVERY,
    EAGER_BATCH,
    FLUSH_INTERVAL_S,
    MAX_BUFFERED_EVENTS,
)
from modtrace.recording.recorder import Recorder

__all__ = ["DEFAULT_FLUSH_EVERY", "EAGER_BATCH", "FLUSH_INTERVAL_S", "MAX_BUFFERED_EVENTS", "Recorder"]
