"""A free TCP port on this machine, for a process the test starts (torchrun's rendezvous,
chromedriver)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS picks it; another process could take it before
    the caller binds it, which is the usual race of this idiom and rare enough for tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
