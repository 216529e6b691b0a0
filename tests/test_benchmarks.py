"""The benchmarks (benchmarks/) do not rot: each one's --help runs, none imports another
benchmark or a private modtrace name, and the shared module's interleaved repeats are
checked on an injected clock."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._common import interleave, medians, ratios

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_the_benchmarks_are_found() -> None:
    assert {p.name for p in SCRIPTS} >= {"bench_analysis.py", "bench_recorder.py", "bench_diff.py", "accuracy_diff.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_runs(script: Path) -> None:
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ")


@pytest.mark.parametrize("script", [*SCRIPTS, BENCHMARKS / "_common.py"], ids=lambda p: p.name)
def test_imports_no_other_benchmark_and_no_private_modtrace_name(script: Path) -> None:
    tree = ast.parse(script.read_text())
    wrong = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [a.name for a in node.names]
            if node.module.startswith("modtrace"):
                wrong += [f"{node.module}.{n}" for n in names if n.startswith("_")]
                wrong += [node.module] if any(part.startswith("_") for part in node.module.split(".")) else []
            if node.module.startswith("benchmarks") and node.module != "benchmarks._common":
                wrong.append(node.module)
            if node.module.startswith("bench") and not node.module.startswith("benchmarks"):
                wrong.append(node.module)
        if isinstance(node, ast.Import):
            wrong += [a.name for a in node.names if a.name.startswith("bench")
                      or (a.name.startswith("modtrace") and any(p.startswith("_") for p in a.name.split(".")))]
    assert wrong == []


class FakeClock:
    """Seconds that move only when a candidate (or a set-up) says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_interleave_takes_turns_and_times_each_call_on_the_clock() -> None:
    clock, cpu = FakeClock(), FakeClock()
    calls: list[str] = []
    cost = {"a": [1.0, 3.0, 2.0, 9.0, 2.0], "b": [4.0, 4.0, 5.0, 4.0, 6.0], "c": [0.5] * 5}

    def candidate(name: str) -> None:
        calls.append(name)
        clock.now += cost[name][sum(1 for c in calls if c == name) - 1]
        cpu.now += 0.25

    def set_up(name: str) -> None:  # off the clock: must not count
        clock.now += 100.0
        cpu.now += 100.0

    seen: list[tuple[str, object]] = []
    samples = interleave(
        {name: (lambda name=name: candidate(name)) for name in ("a", "b", "c")}, 5, clock=clock, cpu_clock=cpu,
        before=set_up, after=lambda name, result: seen.append((name, result)),
    )
    # each repeat starts one candidate later: none always first, none always after the same one
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c", "b", "c", "a"]
    assert [name for name, _ in seen] == calls
    assert samples.wall == cost
    assert samples.cpu == {name: [0.25] * 5 for name in cost}
    meds = medians(samples.wall)
    assert meds == {"a": 2.0, "b": 4.0, "c": 0.5} == samples.medians()
    assert ratios(meds, "b") == {"a": 0.5, "c": 0.125}
    assert samples.ratio("a", "c") == 4.0
    assert samples.paired_differences("b", "a") == [3.0, 1.0, 3.0, -5.0, 4.0]


def test_interleave_takes_a_candidates_own_time_and_can_shuffle() -> None:
    import random

    clock = FakeClock()
    own = iter([0.7, 0.9, 0.8])

    def slow() -> None:
        clock.now += 50.0

    samples = interleave({"child": lambda: next(own), "here": slow}, 3, clock=clock, rng=random.Random(0),
                         own_time=("child",))
    assert samples.wall == {"child": [0.7, 0.9, 0.8], "here": [50.0, 50.0, 50.0]}
    assert samples.medians()["child"] == 0.8
