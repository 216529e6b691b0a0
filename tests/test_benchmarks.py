"""The benchmarks (benchmarks/) do not rot: each one's --help runs, each is listed in
docs/development.md with its latest figure and a link to its section of docs/performance.md,
none imports another benchmark or a private modtrace name, and the shared module's
interleaved repeats are checked on an injected clock."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._common import interleave, medians, ratios

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_the_benchmarks_are_found() -> None:
    assert {p.name for p in SCRIPTS} >= {"bench_analysis.py", "bench_recorder.py", "bench_diff.py", "accuracy_diff.py"}


def listed_benchmarks() -> dict[str, list[str]]:
    """docs/development.md's "Benchmarks" table: script name -> its cells (measures, run, latest figure)."""
    text = (REPO / "docs" / "development.md").read_text()
    section = text.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        name = re.fullmatch(r"`([\w.]+\.py)`", cells[0])
        if line.startswith("|") and name:
            rows[name.group(1)] = cells[1:]
    return rows


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings (outside code blocks): lower case, punctuation
    but - and _ dropped, spaces as -."""
    anchors, fenced = set(), False
    for line in markdown.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            anchors.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def test_every_benchmark_is_documented_with_its_latest_figure() -> None:
    rows = listed_benchmarks()
    assert sorted(rows) == [p.name for p in SCRIPTS], "docs/development.md's Benchmarks table lists every script, no other"
    anchors = heading_anchors((REPO / "docs" / "performance.md").read_text())
    for name, cells in rows.items():
        assert len(cells) == 3 and all(cells), f"{name}: what it measures, how to run it, its latest figure"
        assert f"benchmarks/{name}" in cells[1], f"{name}: the command runs it"
        figure = cells[2]
        links = re.findall(r"\(performance\.md#([\w-]+)\)", figure)
        assert re.search(r"\d", re.sub(r"\(performance\.md#[\w-]+\)", "", figure)), f"{name}: a number, the figure"
        assert links, f"{name}: the figure links to its section of docs/performance.md"
        assert set(links) <= anchors, f"{name}: no such section in docs/performance.md: {set(links) - anchors}"


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
