"""Time per inner module of code compiled by torch.compile (inductor, CPU):
spans attributed from the compiled kernels, nested in the compiled module's
call, for a model compiled whole, in place (``model.compile()``), by region,
and with a graph break; and a diff that blames the module that got slower
inside a compiled graph."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import modtrace
from tests.helpers.database import db_rows
from tests.helpers.device_clock import FakeDeviceClock, FakeEvent, FakeStream
from tests.helpers.recording import FakeClock
from tests.helpers.training import train

pytestmark = pytest.mark.slow  # real inductor compiles


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    """Each test compiles its own models: without a reset, dynamo's recompile limit per
    code object (Net.forward, Block.forward) is reached across tests and it runs them eagerly."""
    torch._dynamo.reset()

D, HEADS, SEQ, BATCH = 32, 4, 8, 4
WIDE = 2048


class MLP(nn.Module):
    def __init__(self, extra: int = 0) -> None:
        super().__init__()
        self.fc = nn.Linear(D, 4 * D)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * D, D)
        # A slower candidate: round trips of the hidden state through a wide
        # matmul and back, in the MLP's own code (no module of their own).
        self.extra = extra
        if extra:
            self.up = nn.Parameter(torch.randn(4 * D, WIDE) * 0.02)
            self.down = nn.Parameter(torch.randn(WIDE, 4 * D) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc(x))
        for _ in range(self.extra):
            h = h + torch.tanh(h @ self.up) @ self.down
        return self.proj(h)


class Block(nn.Module):
    def __init__(self, extra: int = 0, talk: bool = False) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(D)
        self.mlp = MLP(extra)
        self.talk = talk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        if self.talk:
            print("block output", x.shape)  # a graph break
        return x + self.mlp(self.ln2(x))


class Net(nn.Module):
    def __init__(self, extra_in_block2: int = 0, talk_in_block1: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [Block(extra_in_block2 if i == 2 else 0, talk=talk_in_block1 and i == 1) for i in range(4)])
        self.head = nn.Linear(D, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).sum()


def record(db: Path, name: str, model: nn.Module, run: Any, steps: int = 6, **recorder: Any) -> None:
    """Train ``run`` (the model's callable) for ``steps`` steps under a recorder (``recorder``: its other arguments)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, SEQ, D, generator=torch.Generator().manual_seed(0))
    with modtrace.Recorder(db=str(db), run=name, handle_sigterm=False, counters="off", **recorder) as rec:
        train(model, steps, loss=lambda _: run(x), opt=opt)
    rec.wait_analyzed()


def spans(db: Path, run: str) -> list[tuple[Any, ...]]:
    return db_rows(str(db), "SELECT s.span_id, s.parent_span_id, s.fqn, s.phase, s.status, s.step, s.duration_ns, "
                   "s.self_ns FROM spans s JOIN runs r ON r.id = s.run_id WHERE r.name = :run ORDER BY s.span_id", run=run)


def attributed(rows: list[tuple[Any, ...]]) -> set[tuple[str, str]]:
    return {(fqn, phase) for _s, _p, fqn, phase, status, *_ in rows if status == "attributed"}


def inner_modules(prefix: str) -> set[tuple[str, str]]:
    return {(f"{prefix}blocks.{i}.{name}", phase)
            for i in range(4) for name in ("attn", "mlp") for phase in ("forward", "backward")}


def check_sums(rows: list[tuple[Any, ...]], root: str, first_step: int = 1) -> None:
    """Per step, the compiled module's self time plus its inner modules' time is its
    measured time, and the kernels account for most of it (warm steps)."""
    by_id = {r[0]: r for r in rows}
    children: dict[int, list[tuple[Any, ...]]] = {}
    for r in rows:
        if r[1] is not None:
            children.setdefault(r[1], []).append(r)
    checked = 0
    kernels = measured = 0
    for span_id, _parent, fqn, phase, _status, step, duration, self_ns in rows:
        if fqn != root or step < first_step:
            continue
        inner = [c for c in children.get(span_id, []) if c[4] == "attributed"]
        assert inner, f"{root} {phase} at step {step} has no attributed inner module"
        total = self_ns + sum(c[6] for c in inner)
        assert abs(total - duration) <= 0.05 * duration, (fqn, phase, step, total, duration)
        kernels += sum(c[6] for c in inner)
        measured += duration
        checked += 1
        assert by_id[span_id][4] != "attributed"
    assert checked >= 2 * 3, checked  # forward and backward of several warm steps
    # Over the warm steps the kernels account for a good part of the compiled calls'
    # time (the rest: dynamo's guards, the wrapper's Python between kernels, a
    # loaded machine's pauses, all kept as the compiled module's self time).
    assert kernels >= 0.2 * measured, (kernels, measured)


def test_model_compiled_whole_has_every_block_inside(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = Net()
    db = tmp_path / "runs.db"
    record(db, "whole", model, torch.compile(model))
    rows = spans(db, "whole")
    assert inner_modules("Net.") <= attributed(rows)
    check_sums(rows, "Net")
    # check: no "ran compiled, calls not recorded" line when the detail was attributed
    out = run_cli("check", "whole", "--db", str(db), "--format", "json")
    assert out.code == 0
    assert not [r for r in json.loads(out.out) if r["kind"] == "compiled"]
    todo = json.loads(run_cli("tree", "whole", "--db", str(db), "--format", "json").out)
    marked = set()
    while todo:
        node = todo.pop()
        todo.extend(node["children"])
        if node["source"] == "kernels":
            marked.add((node["fqn"], node["phase"]))
    assert inner_modules("Net.") <= marked


def test_diff_blames_the_mlp_that_does_more_inside_the_compiled_graph(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    # On a clock that ticks once per read, a call's time is the kernels (and hooks) that ran inside
    # it: the stored rows, not the host's speed, decide the verdict.
    db = tmp_path / "runs.db"
    torch.manual_seed(0)
    base = Net()
    record(db, "base", base, torch.compile(base), steps=12, clock=FakeClock())
    torch.manual_seed(0)
    cand = Net(extra_in_block2=6)
    record(db, "cand", cand, torch.compile(cand), steps=12, clock=FakeClock())
    res = run_cli("diff", "--db", str(db), "base", "cand", "--format", "json", "--fail-on", "regression")
    doc = json.loads(res.out)
    blamed = {(r["fqn"], r["phase"]) for r in doc["timing"] if r["verdict"] == "regression"}
    assert res.code == 1, doc["summary"]
    assert any(fqn.startswith("Net.blocks.2.mlp") for fqn, _ in blamed), blamed
    assert all(fqn.startswith("Net.blocks.2") for fqn, _ in blamed), blamed


def test_module_compiled_in_place(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    model.compile()
    db = tmp_path / "runs.db"
    record(db, "in-place", model, model)
    rows = spans(db, "in-place")
    # No hook sees a module compiled in place: its call comes from the compiled graph's own.
    roots = {(fqn, phase) for _s, parent, fqn, phase, *_ in rows if parent is None}
    assert {("Net", "forward"), ("Net", "backward")} <= roots
    assert inner_modules("Net.") <= attributed(rows)
    check_sums(rows, "Net")


def test_each_block_compiled_on_its_own(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        block.compile()
    db = tmp_path / "runs.db"
    record(db, "regional", model, model)
    rows = spans(db, "regional")
    by_id = {r[0]: r for r in rows}
    assert inner_modules("Net.") <= attributed(rows)
    for _span_id, parent, fqn, _phase, status, *_ in rows:
        if status == "attributed" and fqn.endswith(".mlp"):
            block = by_id[parent]
            assert block[2] == fqn.rsplit(".", 1)[0] and block[4] != "attributed", (fqn, block)


def test_graph_break_gives_several_regions_each_attributed(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net(talk_in_block1=True)
    db = tmp_path / "runs.db"
    record(db, "breaks", model, torch.compile(model))
    rows = spans(db, "breaks")
    found = attributed(rows)
    # Modules before and after the break are attributed, in forward and backward.
    for fqn in ("Net.blocks.0.mlp", "Net.blocks.3.mlp", "Net.blocks.1.attn"):
        assert {(fqn, "forward"), (fqn, "backward")} <= found, (fqn, sorted(found))


def test_recompile_after_a_shape_change_keeps_the_names(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    db = tmp_path / "runs.db"
    with modtrace.Recorder(db=str(db), run="shapes", handle_sigterm=False, counters="off") as rec:
        for step in range(6):
            seq = SEQ if step < 3 else 2 * SEQ  # a recompile at step 3
            compiled(torch.randn(BATCH, seq, D)).backward()
            opt.step()
            opt.zero_grad()
    rec.wait_analyzed()
    rows = spans(db, "shapes")
    before = {(fqn, phase) for _s, _p, fqn, phase, status, step, *_ in rows if status == "attributed" and 1 <= step < 3}
    after = {(fqn, phase) for _s, _p, fqn, phase, status, step, *_ in rows if status == "attributed" and step >= 4}
    assert inner_modules("Net.") <= before
    assert before == after


def test_hugging_face_gpt2_compiled_whole(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                                     attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(config)
    compiled = torch.compile(model)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    db = tmp_path / "runs.db"
    with modtrace.Recorder(db=str(db), run="gpt2", handle_sigterm=False, counters="off") as rec:
        for _ in range(4):
            compiled(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    rec.wait_analyzed()
    found = attributed(spans(db, "gpt2"))
    for i in range(2):
        for name in ("attn", "mlp"):
            fqn = f"GPT2LMHeadModel.transformer.h.{i}.{name}"
            assert {(fqn, "forward"), (fqn, "backward")} <= found, (fqn, sorted(found))


def test_work_counters_of_a_compiled_model_go_to_its_inner_modules(tmp_path: Path) -> None:
    """The FLOPs of a compiled model's matrix products and attention, counted on the first
    step, are charged to the inner modules their kernels are attributed to: equal, per
    block's attention and MLP and phase, to FlopCounterMode's for the same model run eagerly."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = Net()
    x = torch.randn(BATCH, SEQ, D, generator=torch.Generator().manual_seed(0))
    counter = FlopCounterMode(display=False)
    with counter:
        model(x).backward()
    model.zero_grad()
    oracle = counter.get_flop_counts()
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    db = tmp_path / "runs.db"
    with modtrace.Recorder(db=str(db), run="counted", handle_sigterm=False, counters="every-step") as rec:
        for _ in range(3):
            compiled(x).backward()
            opt.step()
            opt.zero_grad()
    rec.wait_analyzed()
    rows = db_rows(str(db), "SELECT s.fqn, s.phase, s.step, s.flops FROM spans s WHERE s.status = 'attributed' "
                   "AND s.flops IS NOT NULL AND s.step = 2")
    got: dict[tuple[str, str], int] = {}
    for fqn, phase, _step, flops in rows:
        got[(fqn, phase)] = got.get((fqn, phase), 0) + flops
    checked = 0
    for i in range(4):
        for name in ("attn", "mlp"):
            # FlopCounterMode names modules without the root's class, and sums forward
            # and backward; modtrace keeps the phases apart.
            want = sum(oracle.get(f"Net.blocks.{i}.{name}", {}).values())
            have = sum(v for (fqn, _phase), v in got.items() if fqn == f"Net.blocks.{i}.{name}")
            assert want > 0 and have == want, (i, name, have, want, sorted(got.items()))
            checked += 1
    assert checked == 8


class HostMirrorClock(FakeDeviceClock):
    """A device that runs each kernel as the host calls it: an event completes when
    it is recorded, at the host's time (``time.perf_counter_ns``, the recorder's
    clock).  The one boundary faked: it stands in for CUDA events on the CPU."""

    def record(self, event: FakeEvent, stream: FakeStream) -> bool:
        if not super().record(event, stream):
            return False
        event.ts_ns = self.now_ns = time.perf_counter_ns()
        return True


def test_device_time_of_the_inner_modules_comes_from_events_around_their_kernels(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    """The CUDA path on the CPU: with a device clock injected for "cpu" devices, a compiled
    graph's kernels are timed by events recorded either side of each kernel on the current
    stream, and each attributed row gets its device time from its kernels' events."""
    torch.manual_seed(0)
    model = Net()
    db = tmp_path / "runs.db"
    device = HostMirrorClock()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, SEQ, D, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(model)
    with modtrace.Recorder(db=str(db), run="device", handle_sigterm=False, counters="off", device_clock=device) as rec:
        for _ in range(4):
            compiled(x).backward()
            opt.step()
            opt.zero_grad()
    rec.wait_analyzed()
    rows = db_rows(str(db), "SELECT s.span_id, s.parent_span_id, s.fqn, s.phase, s.status, s.step, s.start_ns, s.end_ns, "
                   "s.device_start_ns, s.device_end_ns FROM spans s ORDER BY s.span_id")
    inner = [r for r in rows if r[4] == "attributed"]
    assert inner_modules("Net.") <= {(r[2], r[3]) for r in inner}
    by_id = {r[0]: r for r in rows}
    for _span_id, parent, fqn, phase, _status, _step, start, end, d_start, d_end in inner:
        assert d_start is not None and d_end is not None, (fqn, phase)
        # The events are recorded inside the host interval of the kernels they time
        # (the host clock is read before the first and after the last).
        assert d_end - d_start <= end - start + 2_000, (fqn, phase, d_end - d_start, end - start)
        assert d_end >= d_start
        p = by_id[parent]
        if p[4] == "attributed":  # nested on the device as on the host
            assert p[8] <= d_start and d_end <= p[9], (fqn, p[2])
    # The events were all resolved and given back: the pool holds what was made.
    assert len(device.events) < 20 * len(inner)
    tree = json.loads(run_cli("tree", "device", "--db", str(db), "--clock", "device", "--format", "json").out)
    todo, seen = list(tree) if isinstance(tree, list) else [tree], set()
    while todo:
        node = todo.pop()
        todo.extend(node["children"])
        seen.add((node["fqn"], node["phase"]))
    assert inner_modules("Net.") <= seen


SCRIPT = """
import sys
import torch
from torch import nn

assert "torch._inductor.compile_fx" not in sys.modules  # inductor is imported by the first compile, under the recorder
torch.manual_seed(0)
model = torch.compile(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
"""


def test_modtrace_record_of_a_script_that_compiles_attributes_its_inner_modules(tmp_path: Path) -> None:
    """The usual way in: ``modtrace record`` starts recording before the script imports
    inductor (the detail installs itself when inductor's compiler is imported)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    db = tmp_path / "runs.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_COMPILE_DISABLE", None)
    out = subprocess.run([sys.executable, "-m", "modtrace", "record", "--db", str(db), "-q", str(script)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = db_rows(str(db), "SELECT fqn, phase, status, count(*) FROM spans GROUP BY fqn, phase, status ORDER BY 1, 2, 3")
    # (its input needs no grad: no hook marks the end of its backward, closed with the graph task, as eager)
    assert ("Sequential", "forward", "ok", 3) in got and ("Sequential", "backward", "closed_at_end_of_backward", 3) in got
    inner = {(fqn, phase) for fqn, phase, status, _n in got if status == "attributed"}
    # the Linears' matmuls are their own kernels; ReLU fuses into a neighbour's kernel or the root's
    assert {("Sequential.0", "forward"), ("Sequential.2", "forward"),
            ("Sequential.0", "backward"), ("Sequential.2", "backward")} <= inner, got
