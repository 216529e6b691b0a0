"""The writer process's pipe protocol: frames, and batches packed cheaply.

A frame is an 8-byte little-endian length and a pickle.  A batch of events
is pickled with the pickler's memo off (``Pickler.fast``): the events are
flat tuples of ints and None that never refer to each other, so the memo,
a dict insert for every tuple, only cost time (a good part of the packing,
which the program pays between steps; docs/performance.md, "Recorder hot path").
"""

from __future__ import annotations

import io
import os
import pickle
import select
import struct
from typing import IO, Any

from modtrace.core.contracts import Batch

HEADER = struct.Struct("<Q")
PIPE_BYTES = 1 << 20  # the batches' pipe: room for a few steps' batches, so handing one over never waits
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def frame(message: tuple[Any, ...]) -> bytes:
    """A message as a frame (memo on: any message)."""
    data = pickle.dumps(message, protocol=_PROTOCOL)
    return HEADER.pack(len(data)) + data


def pack_batch(batch: Batch) -> bytes:
    """A ``write`` message as a frame: the batch's fields in order; its rows
    are flat tuples (no memo needed)."""
    buf = io.BytesIO()
    buf.write(bytes(HEADER.size))
    pickler = pickle.Pickler(buf, protocol=_PROTOCOL)
    pickler.fast = True  # no memo: nothing in a batch is referred to twice
    events = batch.events
    pickler.dump(("write", events if isinstance(events, list) else list(events), list(batch.modules),
                  list(batch.threads), list(batch.devices), batch.progress, list(batch.roots), list(batch.device_rows)))
    view = buf.getbuffer()
    HEADER.pack_into(view, 0, len(view) - HEADER.size)
    del view
    return buf.getvalue()


def batch_of(message: tuple[Any, ...]) -> Batch:
    """The batch of a ``write`` message."""
    return Batch(*message[1:])


def unpack_batch(data: bytes) -> Batch:
    """The batch of a frame made by ``pack_batch``."""
    return batch_of(pickle.loads(memoryview(data)[HEADER.size:]))


def send(stream: IO[bytes], message: tuple[Any, ...]) -> None:
    stream.write(frame(message))
    stream.flush()


class Inbox:
    """Frames arriving on a pipe (the child's stdin, the program's end of the
    child's stdout): whole frames, with or without waiting.

    Reads go into one buffer of ``chunk`` bytes allocated here, not into a
    new bytes object per read: ``os.read(fd, 1 MiB)`` allocates and frees a
    megabyte each time, which costs more than the read itself (once a
    step on the program's side, once a batch on the child's; docs/performance.md,
    "Recorder hot path")."""

    def __init__(self, fd: int, chunk: int = 1 << 16) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.closed = False
        self._chunk = bytearray(chunk)
        self._view = memoryview(self._chunk)

    def has_frame(self) -> bool:
        if len(self.buf) < HEADER.size:
            return False
        size: int = HEADER.unpack_from(self.buf)[0]
        return len(self.buf) >= HEADER.size + size

    def wait(self, timeout: float | None) -> bool:
        """Wait until a whole frame (or the end) is here; False on timeout."""
        while not self.has_frame() and not self.closed:
            if timeout is not None and not select.select([self.fd], [], [], timeout)[0]:
                return False
            try:
                n = os.readv(self.fd, [self._chunk])
            except OSError:
                n = 0
            if not n:
                self.closed = True
            self.buf += self._view[:n]
        return True

    def next(self) -> tuple[Any, ...] | None:
        self.wait(None)
        if not self.has_frame():
            return None
        size = HEADER.unpack_from(self.buf)[0]
        with memoryview(self.buf) as view:
            message: tuple[Any, ...] = pickle.loads(view[HEADER.size:HEADER.size + size])
        del self.buf[:HEADER.size + size]
        return message
