"""Run a script or module exactly as ``python SCRIPT`` / ``python -m MODULE`` would.

``modtrace record`` wraps a training script without editing it, so the
script must not be able to tell it is not the interpreter's main program:
``sys.argv``, ``__main__``, ``sys.path[0]`` and ``if __name__ ==
"__main__":`` behave as under ``python``; an uncaught exception prints the
traceback Python would print; ``SystemExit`` gives the exit code Python
would give.  What Python does at the end (print, exit) is turned into an
``Outcome`` the caller records before it exits.

This module knows nothing of the recorder or the database: ``execute``
runs the target and classifies how it ended (``modtrace.cli.record`` puts
the recorder around it).  Run names come from ``modtrace.recording.run_names``.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import io
import os
import re
import runpy
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal

from modtrace.core.errors import Terminated, UsageError

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM


@dataclass(frozen=True)
class Target:
    """What to run: a script path or a module name, and its arguments."""

    kind: Literal["script", "module"]
    name: str  # the path as given, or the dotted module name
    args: tuple[str, ...] = ()

    @property
    def stem(self) -> str:
        """A short name for the target, used in default run names."""
        if self.kind == "module":
            parts = [p for p in self.name.split(".") if p != "__main__"]
            return parts[-1] if parts else self.name
        path = Path(self.name)
        if path.name == "__main__.py":
            return path.resolve().parent.name
        return path.stem or path.resolve().name

    def argv(self) -> list[str]:
        """The command line as ``python`` would have been given it."""
        head = ["python", "-m", self.name] if self.kind == "module" else ["python", self.name]
        return head + list(self.args)


@dataclass(frozen=True)
class Outcome:
    """How the target ended, in the terms a run row and a shell need."""

    status: Literal["completed", "failed", "interrupted"]
    exit_code: int
    error: str | None = None  # exception summary for failed / interrupted


def check_target(target: Target) -> None:
    """Fail with a usage error before anything is recorded when the target cannot run."""
    if target.kind == "script":
        path = Path(target.name)
        if not path.exists():
            raise UsageError(f"script not found: {target.name}")
        if path.is_dir() and not (path / "__main__.py").exists():
            raise UsageError(f"{target.name} is a directory without a __main__.py; cannot run it")
        if path.is_file() and not os.access(path, os.R_OK):
            raise UsageError(f"cannot read script {target.name}: permission denied")
        return
    with _module_search_path():
        try:
            spec = importlib.util.find_spec(target.name)
            if spec is not None and spec.submodule_search_locations is not None:
                # A package runs its __main__, as python -m does.
                if importlib.util.find_spec(f"{target.name}.__main__") is None:
                    raise UsageError(f"{target.name} is a package without a __main__ module; cannot run it with -m")
        except UsageError:
            raise
        except (ImportError, ValueError):
            spec = None
        except Exception as exc:  # the parent package raised while being imported
            raise UsageError(f"cannot import the parent package of {target.name}: {type(exc).__name__}: {exc}") from None
    if spec is None:
        raise UsageError(f"no module named {target.name}")


@contextmanager
def _module_search_path() -> Iterator[None]:
    # python -m puts the working directory first on sys.path.
    saved = sys.path[0] if sys.path else None
    if sys.path:
        sys.path[0] = os.getcwd()
    else:
        sys.path.append(os.getcwd())
    try:
        yield
    finally:
        if saved is not None and sys.path:
            sys.path[0] = saved


class SigtermGuard:
    """While active, SIGTERM raises ``Terminated`` in the main thread.

    ``shield()`` then ignores further SIGTERMs while the caller saves the run;
    leaving the block restores the previous handler.  Off the main thread
    (where handlers cannot be set) it does nothing.
    """

    def __init__(self) -> None:
        self._previous: Any = None
        self._active = False

    def __enter__(self) -> SigtermGuard:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._raise)
            self._active = True
        except ValueError:  # not the main thread
            pass
        return self

    @staticmethod
    def _raise(signum: int, frame: FrameType | None) -> None:
        raise Terminated()

    def shield(self) -> None:
        if self._active:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        if self._active:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._active = False


def _run_script(path: str, args: tuple[str, ...]) -> None:
    abspath = os.path.abspath(path)
    if os.path.isdir(abspath) or not _is_source(abspath):
        # A directory or zip file with __main__.py: runpy knows how.
        sys.argv[:] = [path, *args]
        runpy.run_path(abspath, run_name="__main__")
        return
    sys.argv[:] = [path, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(abspath))
    with io.open_code(abspath) as fh:
        source = fh.read()
    # dont_inherit: this module's __future__ imports must not leak into the target.
    code = compile(source, abspath, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=abspath,
        __cached__=None,
        __package__=None,
        __spec__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", abspath),
        __builtins__=builtins,
    )
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _is_source(path: str) -> bool:
    # runpy treats zip files (and anything importlib can open as a path entry) specially.
    with open(path, "rb") as fh:
        return fh.read(4) != b"PK\x03\x04"


def _run_module(name: str, args: tuple[str, ...]) -> None:
    sys.argv[:] = [name, *args]  # run_module replaces argv[0] with the module's file
    sys.path[0] = os.getcwd()
    runpy.run_module(name, run_name="__main__", alter_sys=True)


_OWN_FILES = {os.path.normcase(os.path.abspath(__file__)), os.path.normcase(os.path.abspath(runpy.__file__))}


def _trim(tb: TracebackType | None) -> TracebackType | None:
    """Drop the leading frames of this module and runpy, so the traceback starts in the target."""
    while tb is not None and os.path.normcase(os.path.abspath(tb.tb_frame.f_code.co_filename)) in _OWN_FILES:
        tb = tb.tb_next
    return tb


def _summary(exc: BaseException) -> str:
    text = str(exc)
    name = type(exc).__qualname__
    module = type(exc).__module__
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    return f"{name}: {text}" if text else name


def _print_exception(exc: BaseException) -> None:
    tb = _trim(exc.__traceback__)
    sys.stderr.flush()
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)


def _exit_outcome(exc: SystemExit) -> Outcome:
    code = exc.code
    if code is None:
        return Outcome("completed", 0)
    if isinstance(code, int):  # bool included, as in Python
        code = int(code)
        return Outcome("completed", 0) if code == 0 else Outcome("failed", code, f"SystemExit: {code}")
    # Python prints any other exit value to stderr and exits with 1.
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return Outcome("failed", 1, f"SystemExit: {code}")


def execute(target: Target) -> Outcome:
    """Run ``target`` in this process as ``python`` would and say how it ended.

    The traceback of an uncaught exception is printed through
    ``sys.excepthook`` (so a hook the target installed is honoured), with the
    runner's own frames removed.  ``sys.argv`` and ``sys.path[0]`` are
    restored afterwards.
    """
    saved_argv = list(sys.argv)
    saved_path0 = sys.path[0] if sys.path else None
    if not sys.path:
        sys.path.append("")
    try:
        try:
            if target.kind == "script":
                _run_script(target.name, target.args)
            else:
                _run_module(target.name, target.args)
        except SystemExit as exc:
            return _exit_outcome(exc)
        except KeyboardInterrupt as exc:
            _print_exception(exc)
            return Outcome("interrupted", EXIT_INTERRUPTED, "KeyboardInterrupt")
        except Terminated:
            return Outcome("interrupted", EXIT_TERMINATED, "SIGTERM")
        except BaseException as exc:
            _print_exception(exc)
            return Outcome("failed", 1, _summary(exc))
        return Outcome("completed", 0)
    finally:
        sys.argv[:] = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
        try:
            sys.stdout.flush()
        except Exception:
            pass


# -- run identity: names and metadata of the process being recorded ------------

def git_commit(cwd: str) -> str | None:
    """HEAD of the repository containing ``cwd``; None outside one or without git."""
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--verify", "-q", "HEAD"],
            cwd=cwd, capture_output=True, text=True, timeout=3, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = proc.stdout.strip()
    return commit if proc.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", commit) else None
