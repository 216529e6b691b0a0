"""The end of a ``modtrace record`` process, without the interpreter's teardown.

Once the recorded program has ended and its run is stored, what is left of the process is
the interpreter's finalization: every module's objects freed, torch's among them, which took
1.3 to 2.6 s on a loaded 2-core machine against 0.02 to 0.2 s for ``os._exit`` after
``import torch`` (docs/performance.md, "Analysis as the run goes").  The user waits for it.
``end_process`` does what that teardown does that anyone could see -- the program's ``atexit``
functions run, open files flushed, the standard streams flushed -- and ends the process.  A
program that left non-daemon threads running is waited for as usual (``end_process`` returns).
"""

from __future__ import annotations

import _io
import atexit
import gc
import os
import sys
import threading


def end_process(code: int) -> None:
    """Run the ``atexit`` functions, flush every open file and end the process with ``code``;
    returns (for the ordinary exit) while a non-daemon thread other than this one runs."""
    if threading.current_thread() is not threading.main_thread():
        return
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.current_thread()):
        return
    atexit._run_exitfuncs()
    for obj in gc.get_objects():  # what finalization would close: files the program left open
        if issubclass(type(obj), _io._IOBase):  # every file object (io.IOBase is an ABC); type(), not a __class__ a proxy may fake
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except Exception:
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
