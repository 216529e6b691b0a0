"""The query library (queries/*.sql): every query runs on SQLite and PostgreSQL
over the same recorded runs, gives the same rows on both, matches its header,
and agrees with the same numbers computed from the polars analysis.

The fixture records real models with an injected clock, so every duration is
exact: run ``base`` has two ranks (rank 1's clock ticks 1.5 times slower, a
straggler), run ``cand`` is rank 0 again with a 50 us delay added inside one
block's MLP. Blocks are checkpointed, so recompute (with early stops) exists.

Every library file needs an entry in CHECKS: a new query without one fails
``test_every_query_has_a_cross_check``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import modtrace
from modtrace.analysis.aggregate import step_samples
from modtrace.results.materialize import compute
from modtrace.store.engine import open_store
from modtrace.store.query import library, library_query, run_query
from modtrace.store.runs import resolve_run
from tests.helpers.database import db_rows
from tests.helpers.postgres import fresh_schema

STEPS = 3
DELAY_NS = 50_000


class Clock:
    """Nanoseconds advancing by ``tick`` per read; ``advance`` stands for work done."""

    def __init__(self, tick: int) -> None:
        self.now = 0
        self.tick = tick

    def __call__(self) -> int:
        self.now += self.tick
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


class Delay(nn.Module):
    """Identity that takes ``ns`` of (clock) time: a deterministic slow-down."""

    def __init__(self, clock: Clock, ns: int) -> None:
        super().__init__()
        self.clock = clock
        self.ns = ns

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(self.ns)
        return x


class Block(nn.Module):
    def __init__(self, clock: Clock, delay_ns: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), Delay(clock, delay_ns), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.ln(x))


class TinyNet(nn.Module):
    def __init__(self, clock: Clock, slow_block: int | None = None) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList(Block(clock, DELAY_NS if i == slow_block else 0) for i in range(2))
        self.head = nn.Linear(8, 16)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def record(db: str, run: str, *, rank: int = 0, world_size: int = 1, tick: int = 1000,
           slow_block: int | None = None) -> None:
    clock = Clock(tick)
    torch.manual_seed(0)
    net = TinyNet(clock, slow_block)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    with modtrace.Recorder(db=db, run=run, rank=rank, world_size=world_size, clock=clock) as _rec:
        for _ in range(STEPS):
            idx = torch.randint(0, 16, (2, 5), generator=gen)
            loss = nn.functional.cross_entropy(net(idx).reshape(-1, 16), idx.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    _rec.wait_analyzed()  # the writer process analyses the run after the with


@dataclass
class Recording:
    engine: str
    db: str
    spans: dict[str, pl.DataFrame]  # run name -> polars spans frame (rebuilt from events)
    issues: dict[str, pl.DataFrame]

    def query(self, name: str, **params: Any) -> list[dict[str, Any]]:
        result = run_query(self.db, library_query(name), {k: str(v) for k, v in params.items()})
        return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def _record_all(db: str, engine: str) -> Recording:
    record(db, "base", rank=0, world_size=2, tick=1000)
    record(db, "base", rank=1, world_size=2, tick=1500)
    record(db, "cand", slow_block=1)
    store = open_store(db)
    try:
        if store.dialect == "postgresql":
            # Fresh tables have no planner statistics until autovacuum analyses
            # them (within a minute or so); without them PostgreSQL can pick
            # nested-loop plans that take seconds even on this small run.
            with store.engine.begin() as conn:
                conn.exec_driver_sql("ANALYZE")
        spans, issues = {}, {}
        for name in ("base", "cand"):
            analysis = compute(store, resolve_run(store, name).id)
            spans[name] = analysis.spans.with_columns(
                pl.col("fqn").cast(pl.String), pl.col("phase").cast(pl.String),
                pl.col("status").cast(pl.String), pl.col("device").cast(pl.String),
            )
            issues[name] = analysis.issues.with_columns(pl.col("phase").cast(pl.String))
    finally:
        store.dispose()
    return Recording(engine, db, spans, issues)


@pytest.fixture(scope="module")
def sqlite_rec(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return _record_all(str(tmp_path_factory.mktemp("queries") / "runs.db"), "sqlite")


@pytest.fixture(scope="module")
def pg_rec() -> Iterator[Recording]:
    with fresh_schema() as url:
        yield _record_all(url, "postgres")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def rec(request: pytest.FixtureRequest) -> Recording:
    return request.getfixturevalue("sqlite_rec" if request.param == "sqlite" else "pg_rec")  # type: ignore[no-any-return]


# --- what the polars analysis says ------------------------------------------------------


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def _approx(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: pytest.approx(v, rel=1e-9, abs=1e-12) if isinstance(v, float) else v for k, v in r.items()}
            for r in rows]


def step_walls(spans: pl.DataFrame) -> pl.DataFrame:
    """(rank, step, wall_ns): first start to the next step's first start; the last step to its last end."""
    return (
        spans.group_by("rank", "step")
        .agg(pl.col("start_ns").min().alias("start"), pl.col("end_ns").max().alias("last"))
        .sort("rank", "step")
        .with_columns(
            (pl.coalesce(pl.col("start").shift(-1).over("rank"), pl.col("last")) - pl.col("start")).alias("wall_ns")
        )
        .select("rank", "step", "wall_ns")
    )


def outer_recompute(spans: pl.DataFrame) -> pl.DataFrame:
    parents = spans.select("rank", pl.col("span_id").alias("parent_span_id"), pl.col("phase").alias("parent_phase"))
    return (
        spans.filter(pl.col("phase") == "recompute")
        .join(parents, on=["rank", "parent_span_id"], how="left")
        .filter(pl.col("parent_phase").is_null() | (pl.col("parent_phase") != "recompute"))
    )


def check_top_self_time(rec: Recording) -> None:
    spans = rec.spans["base"]
    want = (
        spans.group_by("fqn")
        .agg(
            (pl.col("phase") == "forward").sum().alias("calls"),
            pl.col("self_ns").sum().alias("self"),
            pl.col("self_ns").filter(pl.col("phase") == "backward").sum().alias("backward"),
        )
        .sort(["self", "fqn"], descending=[True, False])
    )
    total = want["self"].sum()
    rows = rec.query("top_self_time", run_id="base", limit=1000)
    assert len(rows) == want.height
    for got, exp in zip(rows, want.iter_rows(named=True), strict=True):
        assert (got["fqn"], got["calls"]) == (exp["fqn"], exp["calls"])
        assert got["self_ms"] == pytest.approx(exp["self"] / 1e6)
        assert got["backward_ms"] == pytest.approx(exp["backward"] / 1e6)
        assert got["self_pct"] == pytest.approx(100 * exp["self"] / total)
        assert got["self_ms"] == pytest.approx(got["forward_ms"] + got["backward_ms"] + got["recompute_ms"])
    assert sum(r["self_pct"] for r in rows) == pytest.approx(100)
    # the default limit
    assert len(rec.query("top_self_time", run_id="base")) == min(20, want.height)


def check_step_breakdown(rec: Recording) -> None:
    spans = rec.spans["base"]
    per_phase = spans.group_by("rank", "step").agg(
        *(pl.col("self_ns").filter(pl.col("phase") == p).sum().alias(p) for p in ("forward", "backward", "recompute")),
        pl.col("duration_ns").filter(pl.col("depth") == 0).sum().alias("step_ns"),
        pl.len().alias("spans"),
    )
    want = step_walls(spans).join(per_phase, on=["rank", "step"]).sort("rank", "step")
    rows = rec.query("step_breakdown", run_id="base")
    assert [(r["rank"], r["step"]) for r in rows] == [(r, s) for r in (0, 1) for s in range(STEPS)]
    for got, exp in zip(rows, want.iter_rows(named=True), strict=True):
        inside = exp["forward"] + exp["backward"] + exp["recompute"]
        assert inside == exp["step_ns"]  # self times partition the root spans
        assert got == _approx([{
            "rank": exp["rank"], "step": exp["step"], "step_rule": "optimizer", "wall_ms": exp["wall_ns"] / 1e6,
            "step_ms": exp["step_ns"] / 1e6, "forward_ms": exp["forward"] / 1e6, "backward_ms": exp["backward"] / 1e6,
            "recompute_ms": exp["recompute"] / 1e6, "outside_ms": (exp["wall_ns"] - exp["step_ns"]) / 1e6,
            "module_pct": 100 * exp["step_ns"] / exp["wall_ns"], "spans": exp["spans"],
        }])[0]
        assert got["recompute_ms"] > 0 and got["outside_ms"] >= 0


def check_backward_forward_ratio(rec: Recording) -> None:
    spans = rec.spans["base"]
    outer = outer_recompute(spans).select(
        "rank", "thread_id", "graph_task", pl.col("span_id").alias("r_start"), pl.col("exit_seq").alias("r_exit"),
        pl.col("duration_ns").alias("r_ns"),
    )
    bwd = spans.filter(pl.col("phase") == "backward")
    inside = (
        bwd.join(outer, on=["rank", "thread_id", "graph_task"], how="inner")
        .filter((pl.col("r_start") > pl.col("span_id")) & (pl.col("r_exit") < pl.col("exit_seq")))
        .group_by("rank", "span_id").agg(pl.col("r_ns").sum().alias("inside"))
    )
    per_bwd = (
        bwd.join(inside, on=["rank", "span_id"], how="left")
        .group_by("fqn")
        .agg(
            pl.len().alias("backward_calls"),
            (pl.col("duration_ns") - pl.col("inside").fill_null(0)).sum().alias("bwd"),
            pl.col("inside").fill_null(0).sum().alias("rec"),
            (pl.col("status") == "closed_at_end_of_backward").sum().alias("closed"),
        )
    )
    fwd = spans.filter(pl.col("phase") == "forward").group_by("fqn").agg(
        pl.len().alias("forward_calls"), pl.col("duration_ns").sum().alias("fwd")
    )
    want = {r["fqn"]: r for r in fwd.join(per_bwd, on="fqn").iter_rows(named=True)}
    rows = rec.query("backward_forward_ratio", run_id="base")
    assert {r["fqn"] for r in rows} == set(want)
    for got in rows:
        exp = want[got["fqn"]]
        assert (got["forward_calls"], got["backward_calls"], got["closed_at_end"]) == (
            exp["forward_calls"], exp["backward_calls"], exp["closed"])
        assert got["backward_ms"] == pytest.approx(exp["bwd"] / 1e6)
        assert got["recompute_ms"] == pytest.approx(exp["rec"] / 1e6)
        assert got["ratio"] == pytest.approx(exp["bwd"] / exp["fwd"])
    ratios = [r["ratio"] for r in rows]
    assert ratios == sorted(ratios, reverse=True)
    # the embedding's input needs no grad: its backward is closed at the end of the graph task
    assert next(r for r in rows if r["fqn"] == "TinyNet.emb")["closed_at_end"] == 2 * STEPS


def check_recompute_overhead(rec: Recording) -> None:
    spans = rec.spans["base"]
    outer = outer_recompute(spans)
    want = outer.group_by("fqn").agg(
        pl.len().alias("n"), (pl.col("status") == "early_stop").sum().alias("early"), pl.col("duration_ns").sum().alias("rec")
    )
    fwd = spans.filter(pl.col("phase") == "forward").group_by("fqn").agg(pl.col("duration_ns").sum().alias("fwd"))
    bwd_total = spans.filter((pl.col("phase") == "backward") & pl.col("parent_span_id").is_null())["duration_ns"].sum()
    want = {r["fqn"]: r for r in want.join(fwd, on="fqn").iter_rows(named=True)}
    rows = rec.query("recompute_overhead", run_id="base")
    assert {r["fqn"] for r in rows} == {"TinyNet.blocks.0", "TinyNet.blocks.1"} == set(want)
    for got in rows:
        exp = want[got["fqn"]]
        assert (got["recomputes"], got["early_stops"]) == (exp["n"], exp["early"])
        assert got["recompute_ms"] == pytest.approx(exp["rec"] / 1e6)
        assert got["forward_ms"] == pytest.approx(exp["fwd"] / 1e6)
        assert got["overhead_pct"] == pytest.approx(100 * exp["rec"] / exp["fwd"])
        assert got["backward_share_pct"] == pytest.approx(100 * exp["rec"] / bwd_total)
        assert got["recomputes"] == 2 * STEPS  # two ranks


def check_device_streams(rec: Recording) -> None:
    spans = rec.spans["base"]
    want = spans.group_by("fqn", "device", "stream").agg(
        *((pl.col("phase") == p).sum().alias(f"{p}_calls") for p in ("forward", "backward", "recompute")),
        pl.col("self_ns").sum().alias("self"),
    )
    rows = rec.query("device_streams", run_id="base")
    assert len(rows) == want.height == spans["fqn"].n_unique()  # every module on one device (cpu)
    want_by = {r["fqn"]: r for r in want.iter_rows(named=True)}
    for got in rows:
        exp = want_by[got["fqn"]]
        assert (got["device"], got["stream"], got["placements"]) == ("cpu", None, 1)
        assert [got[f"{p}_calls"] for p in ("forward", "backward", "recompute")] == [
            exp[f"{p}_calls"] for p in ("forward", "backward", "recompute")]
        assert got["self_ms"] == pytest.approx(exp["self"] / 1e6)


def check_slowest_steps(rec: Recording) -> None:
    spans = rec.spans["base"]
    walls = step_walls(spans)
    top = (
        spans.group_by("rank", "step", "fqn", "phase").agg(pl.col("self_ns").sum())
        .sort(["rank", "step", "self_ns", "fqn", "phase"], descending=[False, False, True, False, False])
        .group_by("rank", "step", maintain_order=True).first()
    )
    medians = walls.group_by("rank").agg(pl.col("wall_ns").median().alias("median"))
    want = (
        walls.join(top, on=["rank", "step"]).join(medians, on="rank")
        .sort(["wall_ns", "rank", "step"], descending=[True, False, False])
    )
    rows = rec.query("slowest_steps", run_id="base", limit=100)
    assert len(rows) == want.height == 2 * STEPS
    for got, exp in zip(rows, want.iter_rows(named=True), strict=True):
        assert (got["rank"], got["step"], got["top_module"], got["top_phase"]) == (
            exp["rank"], exp["step"], exp["fqn"], exp["phase"])
        assert got["wall_ms"] == pytest.approx(exp["wall_ns"] / 1e6)
        assert got["top_ms"] == pytest.approx(exp["self_ns"] / 1e6)
        assert got["vs_median_pct"] == pytest.approx(100 * exp["wall_ns"] / exp["median"])
    assert {r["rank"] for r in rows[:STEPS]} == {1}  # the slow clock's rank has the slowest steps
    assert len(rec.query("slowest_steps", run_id="base", limit=2)) == 2


def check_rank_stragglers(rec: Recording) -> None:
    walls = step_walls(rec.spans["base"])
    rows = rec.query("rank_stragglers", run_id="base")
    assert [r["step"] for r in rows] == list(range(STEPS))
    for got in rows:
        w = walls.filter(pl.col("step") == got["step"]).sort("rank")["wall_ns"].to_list()
        assert got["ranks"] == 2
        assert got["fastest_ms"] == pytest.approx(min(w) / 1e6)
        assert got["slowest_ms"] == pytest.approx(max(w) / 1e6)
        assert got["mean_ms"] == pytest.approx(sum(w) / 2e6)
        assert got["spread_ms"] == pytest.approx((max(w) - min(w)) / 1e6)
        # rank 1's clock ticks 1.5 times slower and it makes the same calls
        assert got["slowest_rank"] == 1
        assert got["spread_pct"] == pytest.approx(50.0)
    single = rec.query("rank_stragglers", run_id="cand")
    assert {(r["ranks"], r["spread_ms"], r["slowest_rank"]) for r in single} == {(1, 0.0, 0)}


def check_nesting_summary(rec: Recording) -> None:
    issues = rec.issues["base"]
    want = {
        (r["severity"], r["kind"], r["phase"]): r["n"]
        for r in issues.group_by("severity", "kind", "phase").agg(pl.len().alias("n")).iter_rows(named=True)
    }
    rows = rec.query("nesting_summary", run_id="base")
    assert {(r["severity"], r["kind"], r["phase"]): r["issues"] for r in rows} == want
    assert {r["severity"] for r in rows} == {"info"}  # a healthy record
    assert {r["kind"] for r in rows} == {"early_stop", "closed_at_end_of_backward"}
    for got in rows:
        part = issues.filter((pl.col("kind") == got["kind"]) & (pl.col("phase") == got["phase"])).sort("rank", "seq")
        assert (got["first_seq"], got["example"]) == (part["seq"][0], part["message"][0])
        assert got["modules"] == part["fqn"].n_unique()
        assert got["steps"] == STEPS and got["first_step"] == 0


def _per_step(spans: pl.DataFrame) -> dict[tuple[str, str], tuple[float, float]]:
    units = spans.select("rank", "step").unique().height
    agg = spans.group_by("fqn", "phase").agg(pl.len().alias("calls"), pl.col("self_ns").sum().alias("self"))
    return {(r["fqn"], r["phase"]): (r["calls"] / units, r["self"] / units / 1e6) for r in agg.iter_rows(named=True)}


def check_regressions(rec: Recording) -> None:
    base, cand = _per_step(rec.spans["base"]), _per_step(rec.spans["cand"])
    assert set(base) == set(cand)
    rows = rec.query("regressions", base_run="base", cand_run="cand", limit=1000)
    assert len(rows) == len(base)
    for got in rows:
        (bc, bms), (cc, cms) = base[(got["fqn"], got["phase"])], cand[(got["fqn"], got["phase"])]
        assert (got["base_calls_per_step"], got["cand_calls_per_step"]) == (bc, cc)
        assert got["base_ms_per_step"] == pytest.approx(bms)
        assert got["cand_ms_per_step"] == pytest.approx(cms)
        assert got["delta_ms_per_step"] == pytest.approx(cms - bms)
        expected = "slower" if cms > bms * 1.05 else "faster" if cms < bms * 0.95 else "same"
        assert got["change"] == expected
    # the delay module ran once in forward and once in recompute per step: 50 us each
    top = [(r["fqn"], r["phase"], r["change"]) for r in rows[:2]]
    assert top == [("TinyNet.blocks.1.mlp.2", "forward", "slower"), ("TinyNet.blocks.1.mlp.2", "recompute", "slower")]
    assert rows[0]["delta_ms_per_step"] == pytest.approx(DELAY_NS / 1e6, rel=0.05)
    deltas = [r["delta_ms_per_step"] for r in rows]
    assert deltas == sorted(deltas, reverse=True)
    # a run against itself: nothing changed; run references resolve (@ is the newest run, cand)
    same = rec.query("regressions", base_run="@", cand_run="cand")
    assert {r["change"] for r in same} == {"same"} and all(r["delta_ms_per_step"] == 0 for r in same)
    # a stricter threshold leaves the delayed module slower and nothing else changes direction
    strict = rec.query("regressions", base_run="base", cand_run="cand", threshold_pct=1000, limit=1000)
    assert {r["change"] for r in strict} <= {"same", "slower"}


def check_call_counts(rec: Recording) -> None:
    samples = step_samples(rec.spans["base"].with_columns(pl.col("phase").cast(pl.String)))
    want: dict[tuple[int, int, str], dict[str, int]] = {}
    for r in samples.iter_rows(named=True):
        want.setdefault((r["rank"], r["step"], r["fqn"]), {})[str(r["phase"])] = r["calls"]
    rows = rec.query("call_counts", run_id="base")
    assert len(rows) == len(want)
    for got in rows:
        exp = want[(got["rank"], got["step"], got["fqn"])]
        assert [got[f"{p}_calls"] for p in ("forward", "backward", "recompute")] == [
            exp.get(p, 0) for p in ("forward", "backward", "recompute")]
    # execution order within a step: the root first, then the embedding
    assert [r["fqn"] for r in rows[:2]] == ["TinyNet", "TinyNet.emb"]
    assert [(r["rank"], r["step"]) for r in rows] == sorted((r["rank"], r["step"]) for r in rows)


def _device_run() -> tuple[str, pl.DataFrame]:
    """A run with device times (the test device clock standing in for CUDA), in a SQLite file of its own
    (the shared fixture's runs are CPU runs): (database, its spans)."""
    import tempfile

    from tests.helpers.device_clock import FakeDeviceClock
    from tests.helpers.device_recording import DeviceNet, train_on_device

    db = str(Path(tempfile.mkdtemp(prefix="modtrace-device-")) / "gpu.db")
    device = FakeDeviceClock()
    net = DeviceNet(device)
    with modtrace.Recorder(db=db, run="gpu", device_clock=device, clock=Clock(1000), writer="thread") as r:
        train_on_device(r, net, device, STEPS, 10_000)
    with modtrace.open(db) as database:
        spans = database.spans("gpu").with_columns(pl.col("fqn").cast(pl.String), pl.col("phase").cast(pl.String))
    return db, spans


def check_device_time(rec: Recording) -> None:
    cpu = rec.query("device_time", run_id="base", limit=1000)
    assert {r["fqn"] for r in cpu} == set(rec.spans["base"]["fqn"])
    assert all(r["device_self_ms"] is None and r["timed_spans"] == 0 for r in cpu)
    db, spans = _device_run()
    want = spans.group_by("fqn").agg(pl.col("device_self_ns").sum(), pl.col("device_duration_ns").sum(),
                                     pl.col("self_ns").sum()).sort(["device_self_ns", "fqn"],
                                                                   descending=[True, False])
    rows = run_query(db, library_query("device_time"), {"run_id": "gpu", "limit": "1000"}).rows
    got = [(r[0], r[4], r[6], r[7]) for r in rows]
    assert got == [(f, d / 1e6, i / 1e6, h / 1e6) for f, d, i, h in want.rows()]
    assert got[0][0] == "DeviceNet.b"  # the module that launched the most work
    assert sum(r[5] for r in rows) == pytest.approx(100)


def check_memory_deltas(rec: Recording) -> None:
    cpu = rec.query("memory_deltas", run_id="base", limit=1000)
    assert cpu and all(r["max_delta_bytes"] is None and r["calls"] == 0 for r in cpu)
    db, spans = _device_run()
    rows = run_query(db, library_query("memory_deltas"), {"run_id": "gpu", "limit": "3"}).rows
    biggest = (spans.filter(pl.col("phase") == "forward").group_by("fqn").agg(pl.col("mem_delta_bytes").max())
               .sort(["mem_delta_bytes", "fqn"], descending=[True, False]).head(3))
    assert [(r[0], r[2], r[4]) for r in rows] == [(f, "forward", m) for f, m in biggest.rows()]
    peak = spans.filter((pl.col("fqn") == rows[0][0]) & (pl.col("phase") == "forward"))["mem_max_bytes"].max()
    assert rows[0][6] == peak


def check_throughput(rec: Recording) -> None:
    spans = pl.DataFrame(
        db_rows(rec.db, "SELECT s.fqn, s.phase, s.flops_self, s.bytes_self, s.self_ns, s.unknown_ops_self FROM spans s "
                        "JOIN runs r ON r.id = s.run_id WHERE r.name = 'base' AND s.flops_self IS NOT NULL"),
        schema=["fqn", "phase", "flops", "bytes", "self_ns", "unknown"], orient="row")
    per = (spans.group_by("fqn", "phase").agg(pl.len().alias("spans"), pl.col("flops").sum(), pl.col("bytes").sum(),
                                               pl.col("self_ns").sum())
           .filter((pl.col("flops") > 0) & (pl.col("self_ns") > 0))
           .with_columns((pl.col("flops") / pl.col("self_ns")).alias("rate"))
           .sort("rate", "fqn", "phase"))
    assert per.height >= 2, "the fixture's counted step has modules doing matrix work"
    median = per["rate"].median()
    rows = rec.query("throughput", run_id="base", limit=1000)
    assert [(r["fqn"], r["phase"], r["spans"], r["flops"], r["bytes"]) for r in rows] == \
        [tuple(x) for x in per.select("fqn", "phase", "spans", "flops", "bytes").rows()]
    assert [r["gflop_per_s"] for r in rows] == pytest.approx(per["rate"].to_list())
    assert [r["vs_median"] for r in rows] == pytest.approx([x / median for x in per["rate"].to_list()])
    assert [r["flop_per_byte"] for r in rows] == pytest.approx((per["flops"] / per["bytes"]).to_list())


CHECKS: dict[str, Callable[[Recording], None]] = {
    "throughput": check_throughput,
    "device_time": check_device_time,
    "memory_deltas": check_memory_deltas,
    "top_self_time": check_top_self_time,
    "step_breakdown": check_step_breakdown,
    "backward_forward_ratio": check_backward_forward_ratio,
    "recompute_overhead": check_recompute_overhead,
    "device_streams": check_device_streams,
    "slowest_steps": check_slowest_steps,
    "rank_stragglers": check_rank_stragglers,
    "nesting_summary": check_nesting_summary,
    "regressions": check_regressions,
    "call_counts": check_call_counts,
}

QUERY_NAMES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "queries").glob("*.sql"))


def test_every_query_has_a_cross_check() -> None:
    assert QUERY_NAMES == sorted(q.name for q in library())
    assert sorted(CHECKS) == QUERY_NAMES, "add a cross-check to CHECKS for each queries/*.sql"


@pytest.mark.parametrize("name", QUERY_NAMES)
def test_query_agrees_with_the_polars_analysis(rec: Recording, name: str) -> None:
    if name not in CHECKS:
        pytest.fail(f"queries/{name}.sql has no cross-check in CHECKS")
    CHECKS[name](rec)


def _default_params(name: str) -> dict[str, str]:
    params = library_query(name).param_names
    return {p: ("cand" if p == "cand_run" else "base") for p in params if p in ("run_id", "base_run", "cand_run")}


@pytest.mark.parametrize("name", QUERY_NAMES)
def test_header_documents_the_query(rec: Recording, name: str) -> None:
    query = library_query(name)
    assert query.purpose and query.purpose[0].isupper(), "the header's first line says what the query answers"
    assert [p.name for p in query.params] == list(query.param_names), "every parameter documented, in order of use"
    assert all(p.description for p in query.params)
    result = run_query(rec.db, query, _default_params(name))
    assert [c for c, _ in query.columns] == result.columns, "the header lists the result columns in order"
    assert all(desc for _, desc in query.columns)
    assert result.rows, f"{name} returned nothing on the fixture"


def _normalised(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    out = []
    for row in rows:
        out.append(tuple(round(v, 6) if isinstance(v, float) and math.isfinite(v) else v for v in row))
    return sorted(out, key=repr)


@pytest.mark.postgres
@pytest.mark.parametrize("name", QUERY_NAMES)
def test_sqlite_and_postgres_give_the_same_rows(sqlite_rec: Recording, pg_rec: Recording, name: str) -> None:
    query = library_query(name)
    params = _default_params(name)
    lite = run_query(sqlite_rec.db, query, params)
    pg = run_query(pg_rec.db, query, params)
    assert lite.columns == pg.columns
    # same values and the same types (ints stay ints, ms are floats, NULL is None) on both
    assert _normalised(lite.rows) == _normalised(pg.rows)
    assert [[type(v) for v in r] for r in sorted(lite.rows, key=repr)] == [[type(v) for v in r] for r in sorted(pg.rows, key=repr)]
