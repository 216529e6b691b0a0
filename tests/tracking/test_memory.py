"""Memory per module call on counted steps (modtrace.tracking.memory, modtrace.analysis.memory):
kept and peak bytes per span and each step's peak against torch's MemTracker on an MLP stack and
a small GPT-2, checkpointed modules' recomputation charged to their recompute spans, the counter
policies, two threads, and the columns on SQLite and PostgreSQL."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker, _ModState
from torch.utils.checkpoint import checkpoint

import modtrace
from modtrace.analysis.memory import live_levels
from tests.helpers.database import db_rows
from tests.helpers.memory import MlpStack

CPU = torch.device("cpu")


def _gpt2() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0,
                        eos_token_id=0, attn_implementation="eager")
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 128, (2, 16))
    return model, lambda: model(input_ids=ids, labels=ids).loss


def _mlp() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = MlpStack(64, 3)
    x = torch.randn(16, 64)
    return model, lambda: model(x).sum()


def test_a_storage_object_lives_as_long_as_its_memory() -> None:
    # What the recorder's weak references rest on: one Python object per storage, shared by
    # its views, kept while any tensor (or autograd's saved tensors) holds the memory.
    freed: list[str] = []
    a = torch.randn(100)
    b = a.view(10, 10)
    assert a.untyped_storage() is b[1:].untyped_storage()
    ref = weakref.ref(a.untyped_storage(), lambda _: freed.append("a"))
    del a
    gc.collect()
    assert not freed and ref() is not None
    del b
    assert freed == ["a"]
    x = torch.randn(50, requires_grad=True)
    y = x.exp()  # exp saves its output for the backward
    ref_y = weakref.ref(y.untyped_storage(), lambda _: freed.append("y"))
    loss = y.sum()
    del y
    assert freed == ["a"]
    loss.backward()
    del loss
    assert freed == ["a", "y"] and ref_y() is None


@pytest.mark.parametrize("build", [_mlp, _gpt2], ids=["mlp", "gpt2"])
def test_kept_and_peak_equal_memtracker(build: Callable[[], tuple[nn.Module, Callable[[], torch.Tensor]]],
                                        db_path: Path) -> None:
    torch.manual_seed(0)
    model, loss = build()
    opt = torch.optim.Adam(model.parameters())

    def step() -> None:
        loss().backward()
        opt.step()
        opt.zero_grad()

    with modtrace.Recorder(str(db_path), counters="every-step", writer="thread"):
        step()  # Adam's state exists from here: the second step starts with it
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            step()
    root = type(model).__name__
    modules = {(f"{root}.{n}" if n else root): m for n, m in model.named_modules()}
    rows = db_rows(db_path, "SELECT fqn, kept_mem_bytes, peak_mem_bytes FROM spans "
                            "WHERE phase = 'forward' AND step = 1 ORDER BY span_id")
    compared = 0
    for fqn, kept, peak in rows:
        stats = tracker.memory_tracking[modules[fqn]]
        pre = stats.snapshots[_ModState.PRE_FW][0][CPU]["Total"]
        post = stats.snapshots[_ModState.POST_FW][0][CPU]["Total"]
        top = stats.snapshots[_ModState.PEAK_FW][0][CPU]["Total"]
        assert kept == pytest.approx(post - pre, rel=0.05, abs=512), fqn
        assert peak == pytest.approx(top - pre, rel=0.10, abs=512), fqn
        compared += 1
    assert compared >= 10
    ((peak_bytes, base_bytes),) = db_rows(db_path, "SELECT peak_bytes, base_bytes FROM step_memory WHERE step = 1")
    assert peak_bytes == pytest.approx(tracker.get_tracker_snapshot("peak")[CPU]["Total"], rel=0.10)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert base_bytes >= 3 * params  # parameters and Adam's two moments were alive as it began


class _Checkpointed(nn.Module):
    """An MLP stack whose blocks run under torch.utils.checkpoint."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.stack = MlpStack(64, 3)
        self.reentrant = reentrant
        for block in self.stack.blocks:
            original = block.forward

            def forward(x: torch.Tensor, _original: Callable[..., Any] = original) -> Any:
                return checkpoint(_original, x, use_reentrant=self.reentrant)

            block.forward = forward  # type: ignore[method-assign]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.stack(x)
        return out


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_recomputation_is_charged_to_recompute_spans(reentrant: bool, db_path: Path) -> None:
    torch.manual_seed(0)
    model = _Checkpointed(reentrant)
    x = torch.randn(16, 64, requires_grad=True)
    tracker = MemTracker()
    tracker.track_external(model, x)
    with modtrace.Recorder(str(db_path), counters="first", writer="thread"), tracker:
        model(x).sum().backward()
    blocks = "fqn LIKE '_Checkpointed.stack.blocks._'"
    # The blocks' inner modules run again in the backward: their allocations are the recompute spans',
    # what MemTracker snapshots around the recomputation (its PRE_FW_AC and POST_FW_AC states; it
    # keeps no peak of its own for it, only the peak of the backward it ran in).
    recompute = db_rows(db_path, "SELECT fqn, kept_mem_bytes, peak_mem_bytes FROM spans "
                                 "WHERE phase = 'recompute' AND fqn LIKE '%.fc1'")
    assert len(recompute) == 3
    fc1_out = 16 * 256 * 4
    assert all(kept >= fc1_out and peak >= fc1_out for _, kept, peak in recompute)
    modules = {f"_Checkpointed.{n}": m for n, m in model.named_modules() if n}
    for fqn, kept, _ in recompute:
        snaps = tracker.memory_tracking[modules[fqn]].snapshots
        ac = snaps[_ModState.POST_FW_AC][0][CPU]["Total"] - snaps[_ModState.PRE_FW_AC][0][CPU]["Total"]
        assert kept == pytest.approx(ac, rel=0.05), fqn
    # A checkpointed block's forward keeps what it returns (16 x 64 floats), not its activations.
    returned = 16 * 64 * 4
    forward = db_rows(db_path, "SELECT s.kept_mem_bytes, s.peak_mem_bytes, (SELECT SUM(m.nbytes) FROM mem_returns r "
                               "JOIN mem_storages m ON m.run_id = r.run_id AND m.rank = r.rank AND m.sid = r.sid "
                               "WHERE r.run_id = s.run_id AND r.call_id = s.call_id) "
                               f"FROM spans s WHERE s.phase = 'forward' AND {blocks}")
    assert len(forward) == 3
    for kept, peak, returns in forward:
        assert kept == pytest.approx(returned, rel=0.05)
        assert returns == returned
        assert peak >= 2 * fc1_out  # fc1's and GELU's outputs lived during the call, and were let go
    # The gradients are made in the backward (in a nested graph task under reentrant checkpointing,
    # still inside the root's backward span) and kept past it.
    ((root_kept,),) = db_rows(db_path, "SELECT kept_mem_bytes FROM spans WHERE phase = 'backward' AND fqn = '_Checkpointed'")
    assert root_kept >= sum(p.numel() * p.element_size() for p in model.parameters())


def test_columns_on_sqlite_and_postgres(any_db: str) -> None:
    torch.manual_seed(0)
    model = MlpStack(32, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with modtrace.Recorder(any_db, counters="first", writer="thread"):
        for _ in range(2):
            model(torch.randn(8, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
    by_step = db_rows(any_db, "SELECT step, COUNT(*), COUNT(kept_mem_bytes), COUNT(peak_mem_bytes_self), "
                              "SUM(kept_mem_bytes_self) FROM spans GROUP BY step ORDER BY step")
    assert [r[0] for r in by_step] == [0, 1]
    (_, spans0, kept0, peak0, self0), (_, spans1, kept1, _, _) = by_step
    assert kept0 == peak0 == spans0 and self0 > 0  # the counted step (first of its kind)
    assert kept1 == 0 and spans1 > 0  # the second step was not counted
    steps = db_rows(any_db, "SELECT step, device, base_bytes, peak_bytes FROM step_memory")
    assert len(steps) == 1 and steps[0][0] == 0 and steps[0][1] == "cpu" and steps[0][3] > steps[0][2] > 0


def test_every_step_and_off(tmp_path: Path) -> None:
    model = MlpStack(32, 2)
    for policy, counted in (("every-step", 3), ("off", 0)):
        db = str(tmp_path / f"{policy}.db")
        with modtrace.Recorder(db, counters=policy, writer="thread"):
            for _ in range(3):
                model(torch.randn(8, 32)).sum().backward()
                model.zero_grad()
        # no optimizer: each root call is a step
        roots = db_rows(db, "SELECT COUNT(*) FROM spans WHERE depth = 0 AND phase = 'forward' "
                            "AND kept_mem_bytes IS NOT NULL")[0][0]
        assert roots == counted, policy
        assert len(db_rows(db, "SELECT 1 FROM step_memory")) == counted
        assert bool(db_rows(db, "SELECT COUNT(*) FROM mem_storages")[0][0]) == bool(counted)


class _Holds(nn.Module):
    """Allocates ``size`` floats, then waits for the other thread to have done the same."""

    def __init__(self, size: int, barrier: threading.Barrier) -> None:
        super().__init__()
        self.size = size
        self.barrier = barrier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        held = x.new_ones(self.size)
        self.barrier.wait()
        self.barrier.wait()  # both hold their tensor here
        return held.sum() + x.sum()


def test_two_threads_do_not_charge_each_other(db_path: Path) -> None:
    barrier = threading.Barrier(2)
    sizes = {"small": 1000, "large": 100_000}
    models = {name: _Holds(size, barrier) for name, size in sizes.items()}
    with torch.no_grad(), modtrace.Recorder(str(db_path), counters="every-step", writer="thread"):
        threads = [threading.Thread(target=models[name], args=(torch.ones(4),), name=name) for name in sizes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    rows = db_rows(db_path, "SELECT t.name, s.peak_mem_bytes FROM spans s JOIN threads t ON t.run_id = s.run_id "
                            "AND t.thread_id = s.thread_id WHERE s.depth = 0")
    peaks = dict(rows)
    for name, size in sizes.items():
        # its own tensor and a few scalars, never the other thread's
        assert size * 4 <= peaks[name] < size * 4 + 1024, (name, peaks)


def test_live_levels_follow_the_recorded_order() -> None:
    # A range at first_seq 10: one baseline storage (100 B, freed at 12), then at position 12 an
    # allocation of 50 B (sid 3) before that free (order 4), then 70 B (sid 5) after it.
    storages = pl.DataFrame({
        "rank": [0, 0, 0], "first_seq": [10, 10, 10], "sid": [1, 3, 5], "device": [0, 0, 0], "nbytes": [100, 50, 70],
        "alloc_seq": [None, 12, 12], "free_seq": [12, None, None], "free_order": [4, None, None],
        "call_id": [0, 1, 1], "phase": [0, 0, 0], "graph_task": [-1, -1, -1],
    })
    levels = live_levels(storages)
    assert levels["delta"].to_list() == [50, -100, 70]
    assert levels["level"].to_list() == [150, 50, 120]
    assert levels["pos"].to_list() == [12, 12, 12]
