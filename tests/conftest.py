"""Shared fixtures: a real temp SQLite file per test, the real PostgreSQL
server when MODTRACE_TEST_PG_URL is set, and a guard that no torch hook
outlives a test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.postgres import fresh_schema


@pytest.fixture(autouse=True)
def _isolated_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point modtrace's default database at a temp file, so no test touches ./modtrace.db."""
    path = tmp_path / "modtrace.db"
    monkeypatch.setenv("MODTRACE_DB", str(path))
    return path


@pytest.fixture
def db_path(_isolated_db: Path) -> Path:
    return _isolated_db


_SKIP_LINE = pytest.StashKey[str]()


def skip_summary(reports: list[pytest.TestReport]) -> str:
    """One line: how many tests were skipped, grouped by reason, most common first."""
    if not reports:
        return "skipped: none"
    counts: dict[str, int] = {}
    for report in reports:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        counts[reason] = counts.get(reason, 0) + 1
    groups = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return f"skipped {len(reports)}: " + "; ".join(f"{n} {reason}" for reason, n in groups)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    config.stash[_SKIP_LINE] = skip_summary(terminalreporter.stats.get("skipped", []))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # After pytest's own last line (the counts), so that what was skipped, and why, ends the run.
    line = config.stash.get(_SKIP_LINE, None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if line is not None and reporter is not None:
        reporter.write_line(line)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL for a fresh, empty PostgreSQL schema, dropped after the test."""
    with fresh_schema() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_db(request: pytest.FixtureRequest, db_path: Path) -> str:
    """The same test on a SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        return str(db_path)
    return str(request.getfixturevalue("pg_url"))


def _torch_hook_state() -> dict[str, int]:
    import sys

    if "torch" not in sys.modules:
        return {}
    import torch.nn.modules.module as m
    import torch.optim.optimizer as o

    return {
        "forward_pre": len(m._global_forward_pre_hooks),
        "forward": len(m._global_forward_hooks),
        "backward_pre": len(m._global_backward_pre_hooks),
        "backward": len(m._global_backward_hooks),
        "optimizer_pre": len(o._global_optimizer_pre_hooks),
        "optimizer_post": len(o._global_optimizer_post_hooks),
    }


@pytest.fixture(autouse=True)
def _no_leaked_hooks() -> Iterator[None]:
    """Fail a test that leaves a global module or optimizer hook behind."""
    before = _torch_hook_state()
    yield
    after = _torch_hook_state()
    leaked = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert not leaked, f"global torch hooks leaked by this test: {leaked}"


# --- running the CLI and checking files ------------------------------------


class CliResult:
    """Exit code and captured output of one in-process ``modtrace`` invocation."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code = code
        self.out = out
        self.err = err

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, out={self.out!r}, err={self.err!r})"


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run ``modtrace ARGS...`` in this process through the real entry point
    (``modtrace.cli.main``: error formatting and exit codes included)."""

    def run(*args: str) -> CliResult:
        from modtrace.cli import main

        capsys.readouterr()
        code: int
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run


def _file_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def digest():  # type: ignore[no-untyped-def]
    """sha256 of a file's bytes, to show that a refused file was left untouched."""
    return _file_digest
