"""The renderer registry: one interface, one registry chosen by ``--format``; and the diff's
exit status decided by the diff result, not by a renderer."""

from __future__ import annotations

import click
import polars as pl
import pytest

from modtrace.analysis.diff import STRUCTURE_SCHEMA, DiffResult
from modtrace.cli import cli
from modtrace.renderers import REGISTRY, Renderer, Table, formats, get_renderer


def test_every_registered_renderer_implements_the_one_interface() -> None:
    assert set(REGISTRY) == {"rows", "tree", "diff", "stragglers", "memory", "report", "trace"}
    for kind, names in REGISTRY.items():
        for name in names:
            renderer = get_renderer(kind, name)  # type: ignore[call-overload]
            assert isinstance(renderer, Renderer)
            assert (type(renderer).kind, type(renderer).name) == (kind, name)
    with pytest.raises(ValueError, match="no 'tree' renderer named 'csv'"):
        get_renderer("tree", "csv")


def test_the_commands_offer_the_formats_their_renderers_have() -> None:
    def choices(command: str) -> tuple[str, ...]:
        cmd = cli.get_command(click.Context(cli), command)
        assert cmd is not None
        option = next(p for p in cmd.params if p.name == "fmt")
        return tuple(option.type.choices)  # type: ignore[attr-defined]

    assert choices("tree") == formats("tree")
    assert choices("diff") == formats("diff")
    assert choices("stragglers") == formats("stragglers")
    assert choices("memory") == formats("memory")
    for command in ("runs", "show", "check", "query"):
        assert set(choices(command)) <= set(formats("rows"))


def test_a_rows_renderer_and_a_csv_of_none() -> None:
    assert get_renderer("rows", "csv").render(Table(["a", "b"], [[1, None]])) == "a,b\n1,\n"
    assert get_renderer("rows", "markdown").render(Table(["a"], [["x|y"]], "T")) == "### T\n\n| a |\n|---|\n| x\\|y |\n"


def _result(regressions: int, structure_changes: int, step: str = "unchanged") -> DiffResult:
    from modtrace.analysis.diff import DiffSummary, StepVerdict

    summary = DiffSummary(base_steps=5, cand_steps=5, base_step_ns=1e6, cand_step_ns=1e6, compared=3,
                          regressions=regressions, improvements=0, inherited=0, structure_changes=structure_changes,
                          min_p_value=0.008, min_steps=6, order_varies=False, history_runs=2)
    verdict = StepVerdict(verdict=step, measure="raw", checks=(), ratio=1.0, p_value=0.5, bounds=None,
                          level_low_ns=1e6, level_high_ns=1e6)
    return DiffResult(timing=pl.DataFrame(), structure=pl.DataFrame(schema=STRUCTURE_SCHEMA), divergence=None,
                      summary=summary, step=verdict)


@pytest.mark.parametrize(
    ("regressions", "structure", "fail_on", "code"),
    [
        (0, 0, "regression", 0), (1, 0, "regression", 1), (0, 2, "regression", 0),
        (0, 2, "structure", 1), (1, 0, "structure", 0),
        (1, 0, "any", 1), (0, 1, "any", 1), (0, 0, "any", 0),
        (3, 3, "never", 0),
    ],
)
def test_the_diff_result_decides_the_exit_status(regressions: int, structure: int, fail_on: str, code: int) -> None:
    result = _result(regressions, structure)
    assert result.exit_code(fail_on) == code
    assert result.failed(fail_on) is bool(code)


def test_a_step_wide_regression_fails_the_gate_alone() -> None:
    assert _result(0, 0, "regression").exit_code("regression") == 1
    assert _result(0, 0, "unknown").exit_code("regression") == 0


def test_an_unknown_fail_on_is_refused() -> None:
    with pytest.raises(ValueError, match="fail_on must be one of"):
        _result(1, 0).failed("regressions")
