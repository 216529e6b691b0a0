"""Achieved throughput per module (``tree``, ``Database.tree``, the report) on real recordings
with work counters: FLOPs per step equal torch's own FlopCounterMode's, GFLOP/s is them over
the module's median inclusive time per step read from the ``spans`` SQL view, and
``Database.spans`` carries the view's counter columns."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import modtrace
from modtrace.core.contracts import SPAN_COUNTS
from modtrace.core.errors import UsageError
from modtrace.renderers import get_renderer
from modtrace.renderers.base import Terminal
from modtrace.renderers.tree import TreeView
from tests.helpers.database import db_rows
from tests.helpers.training import train

STEPS = 5


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Sequential(nn.Linear(128, 128), nn.GELU()), nn.Linear(128, 8))


def _record(db: str, run: str, counters: str = "first", analyze: bool = True) -> tuple[nn.Module, torch.Tensor]:
    model = _model()
    x = torch.randn(32, 64)
    with modtrace.Recorder(db=db, run=run, writer="inline", counters=counters, analyze=analyze):
        train(model, STEPS, inputs=x)
    return model, x


def _flop_counter(model: nn.Module, x: torch.Tensor) -> dict[tuple[str, str], int]:
    """torch's own FLOPs per (module, phase) of one step: the forward alone, and the forward
    and backward less the forward."""
    with FlopCounterMode(display=False) as fwd:
        model(x)
    with FlopCounterMode(display=False) as both:
        model(x).sum().backward()
    model.zero_grad()
    forward = {k: sum(v.values()) for k, v in fwd.get_flop_counts().items() if k != "Global"}
    total = {k: sum(v.values()) for k, v in both.get_flop_counts().items() if k != "Global"}
    out = {(k, "forward"): v for k, v in forward.items()}
    out.update({(k, "backward"): v - forward.get(k, 0) for k, v in total.items()})
    return out


def _flat(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for node in nodes:
        out.append(node)
        out.extend(_flat(node["children"]))
    return out


def _median_incl_ns(db: str, run: str, fqn: str, phase: str) -> float:
    """The module's inclusive time per step (summed over its calls in the step), median over
    its steps, from the spans SQL view."""
    rows = db_rows(db, "SELECT s.step, SUM(s.duration_ns) FROM spans s JOIN runs r ON r.id = s.run_id "
                       "WHERE r.name = :run AND s.fqn = :fqn AND s.phase = :phase GROUP BY s.step",
                   run=run, fqn=fqn, phase=phase)
    return float(statistics.median(int(ns) for _, ns in rows))


def test_tree_work_is_torch_flops_over_the_views_time_per_step(any_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    model, x = _record(any_db, "work")
    expected = _flop_counter(model, x)
    out = run_cli("tree", "work", "--db", any_db, "--format", "json", "--peak-tflops", "0.5")
    assert out.code == 0, out
    nodes = _flat(json.loads(out.out))
    assert {(n["fqn"], n["phase"]) for n in nodes} >= set(expected)
    for node in nodes:
        key = (node["fqn"], node["phase"])
        assert node["counted_steps"] == 1, key  # --counters first: one step of the one kind
        assert node["flops_per_step"] == expected.get(key, 0), key
        ns = _median_incl_ns(any_db, "work", *key)
        assert node["gflop_per_s"] == pytest.approx(expected.get(key, 0) / ns, rel=1e-9), key
        assert node["peak_percent"] == pytest.approx(node["gflop_per_s"] / 500.0 * 100, rel=1e-9), key
        if node["bytes_per_step"]:
            assert node["flop_per_byte"] == pytest.approx(node["flops_per_step"] / node["bytes_per_step"]), key
    linear = next(n for n in nodes if n["fqn"] == "Sequential.0" and n["phase"] == "forward")
    # bytes: its input, weight, bias and output (float32), as counted for addmm
    assert linear["bytes_per_step"] == 4 * (32 * 64 + 64 * 128 + 128 + 32 * 128)
    assert linear["unknown_ops_per_step"] == 0
    # the table shows the same numbers, and % peak with a peak
    table = run_cli("tree", "work", "--db", any_db, "--peak-tflops", "0.5").out
    header = table.splitlines()[0].split("  ")
    # the counted step also measured memory, whose columns follow the work's
    assert [h.strip() for h in header if h.strip()][-6:] == [
        "FLOPs/step", "GFLOP/s", "FLOP/B", "% peak", "kept/step", "peak mem"]
    assert "% peak" not in run_cli("tree", "work", "--db", any_db).out


def test_the_stored_tree_and_the_spans_agree_on_work_and_an_unanalysed_run_computes_it(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(db_path)
    _record(db, "stored")
    _record(db, "raw", analyze=False)
    keys = ("fqn", "phase", "counted_steps", "flops_per_step", "bytes_per_step", "unknown_ops_per_step")

    def work(*args: str) -> list[tuple[Any, ...]]:
        found = run_cli("tree", *args, "--format", "json")
        assert found.code == 0, found
        return [tuple(n[k] for k in keys) for n in _flat(json.loads(found.out))]

    whole = work("stored")  # the stored tree
    assert any(row[3] for row in whole)
    assert work("stored", "--rank", "0") == whole  # from the spans
    assert work("stored", "--step", "0") == whole  # the counted step alone
    assert all(row[2:] == (None,) * 4 for row in work("stored", "--step", "3"))  # a step not counted
    assert work("raw") == whole  # never analysed: counts computed from call_counters
    assert db_rows(db, "SELECT COUNT(*) FROM span_counter_rows sc JOIN runs r ON r.id = sc.run_id "
                       "WHERE r.name = 'raw'") == [(0,)]  # and nothing written


def test_database_spans_carries_the_views_counter_columns(any_db: str) -> None:
    _record(any_db, "counted", counters="every-step")
    _record(any_db, "plain", counters="off")
    cols = ", ".join(SPAN_COUNTS.names)
    with modtrace.open(any_db) as db:
        for run in ("counted", "plain"):
            spans = db.spans(run)
            assert spans.select(SPAN_COUNTS.names).schema == pl.Schema(SPAN_COUNTS.polars())
            view = db_rows(any_db, f"SELECT s.rank, s.span_id, {cols} FROM spans s JOIN runs r ON r.id = s.run_id "
                                   "WHERE r.name = :run ORDER BY s.rank, s.span_id", run=run)
            assert spans.sort("rank", "span_id").select("rank", "span_id", *SPAN_COUNTS.names).rows() == view
        assert db.spans("counted")["flops"].null_count() == 0
        assert db.spans("plain")["flops"].null_count() == db.spans("plain").height
        named = db.spans("counted", named=True)
        assert set(SPAN_COUNTS.names) <= set(named.columns)
        tree = db.tree("plain")
        assert tree["gflop_per_s"].null_count() == tree.height  # nothing counted: no work


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf"])
def test_a_bad_peak_is_a_one_line_usage_error(db_path: Path, run_cli, value: str) -> None:  # type: ignore[no-untyped-def]
    _record(str(db_path), "work", counters="off")
    for command in (("tree", "work"), ("report", "work", "-o", str(db_path.parent / "r.html"))):
        out = run_cli(*command, f"--peak-tflops={value}")
        assert out.code == 2, out
        assert out.err.startswith("modtrace: error: ") and out.err.count("\n") == 1, out.err
        assert "--peak-tflops" in out.err
    with modtrace.open(str(db_path)) as db, pytest.raises(UsageError, match="peak_tflops"):
        db.tree("work", peak_tflops=0)


def test_the_report_shows_the_trees_work_per_module(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    model, x = _record(str(db_path), "work")
    expected = _flop_counter(model, x)
    html = db_path.parent / "r.html"
    out = run_cli("report", "work", "-o", str(html), "--peak-tflops", "2", "-q")
    assert out.code == 0, out
    found = re.search(r'<script type="application/json" id="modtrace-data">(.*?)</script>', html.read_text(), re.S)
    assert found is not None
    data = json.loads(found.group(1))
    assert data["peak_tflops"] == 2
    rows = {(r["fqn"], r["phase"]): r for r in data["top_modules"]}
    assert set(expected) <= set(rows)
    for key, flops in expected.items():
        row = rows[key]
        assert row["flops_per_step"] == flops, key
        ns = _median_incl_ns(str(db_path), "work", *key)
        assert row["gflop_per_s"] == pytest.approx(flops / ns, rel=1e-9), key
        assert row["peak_percent"] == pytest.approx(row["gflop_per_s"] / 2000 * 100, rel=1e-9), key


def test_a_narrow_terminal_drops_intensity_before_the_totals() -> None:
    node = {"node_id": 1, "parent_node_id": None, "level": 0, "fqn": "Net.with.a.rather.long.name", "module_type": "Net",
            "phase": "forward", "calls": 3, "steps": 3, "inclusive_total_ns": 3_000_000, "self_total_ns": 1_000_000,
            "inclusive_median_ns": 1_000_000.0, "self_median_ns": 333_000.0, "percent": 100.0, "source": "hooks",
            "counted_steps": 1, "flops_per_step": 2.5e9, "bytes_per_step": 1e8, "unknown_ops_per_step": 0.0,
            "gflop_per_s": 2500.0, "flop_per_byte": 25.0, "peak_percent": None}
    wide = get_renderer("tree", "table", terminal=Terminal(width=300)).render(TreeView([node]))
    assert wide.splitlines()[1].split()[-4:] == ["2.5", "G", "2.5e+03", "25"]
    assert "FLOP/B" in wide.splitlines()[0] and "% peak" not in wide
    narrow = get_renderer("tree", "table", terminal=Terminal(width=100)).render(TreeView([node]))
    head = narrow.splitlines()[0]
    assert "FLOP/B" not in head and "GFLOP/s" in head and "FLOPs/step" in head
    assert all(len(line) <= 100 for line in narrow.splitlines())
