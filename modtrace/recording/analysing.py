"""The end-of-recording analysis: handed to the writer process, so the
program does not wait for it, or done here when batches were written here.

The writer process analyses the rank once it has committed the last batch
(``WriterProcess.analyze_after``); ``Recorder.wait_analyzed`` waits for it,
``modtrace record`` always does, and ``analysis_stored`` then says whether
the spans and issues are stored.  A program that exits first leaves the
writer process to finish the analysis on its own.
"""

from __future__ import annotations

import sys

from modtrace.core.errors import one_line
from modtrace.recording.writer_process import WriterProcess
from modtrace.store.engine import Store


class Analysing:
    """A mixin over the attributes ``Recorder.__init__`` sets, listed below."""

    run_id: int
    rank: int
    run_name: str
    status: str | None
    analysis_stored: bool | None
    _proc: WriterProcess | None
    _analyst: WriterProcess | None
    _store: Store | None

    def _hand_analysis_over(self, complete: bool) -> None:
        """The writer process, when batches went through it, analyses the rank
        once it has committed the last one, while the program goes on."""
        proc = self._proc
        if proc is not None and proc.alive and proc.is_ready and proc.analyze_after(complete, self.run_name):
            self._analyst = proc

    def wait_analyzed(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until done) for the end-of-recording
        analysis, which the writer process does after the recording ends; True once
        there is nothing to wait for (``analysis_stored`` then says whether it was stored)."""
        proc = self._analyst
        if proc is None:
            return True
        got = proc.wait_analyzed(timeout)
        if got is None:
            return False
        self._analyst = None
        self.analysis_stored, why = got
        if not got[0] and why is not None and "exited" in why:  # the writer process died: say so here
            print(f"modtrace: warning: analysing run {self.run_name!r} failed: {why}; "
                  f"rerun `modtrace analyze {self.run_name}`", file=sys.stderr)
        return True

    def _materialize(self) -> bool:
        """Analyse the rank in this process; whether its analysis is stored."""
        try:
            from modtrace.results.materialize import materialize
        except ImportError:  # analysis layer not installed in this build
            return False
        assert self._store is not None
        try:
            materialize(self._store, self.run_id, rank=self.rank, complete=self.status == "completed")
        except Exception as exc:  # the events are safe; analysis can be rerun with `modtrace analyze`
            print(f"modtrace: warning: analysing run {self.run_name!r} failed: {one_line(exc)}; "
                  f"rerun `modtrace analyze {self.run_name}`", file=sys.stderr)
            return False
        return True
