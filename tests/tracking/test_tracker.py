"""The recorder's hooks on real models: every case of the recorder issue.

Each test records a real torch model on CPU through the real ``Tracker`` (a
list as the sink, a counter as the clock) and checks the rows: a healthy
model must give a faithful record, with no false alarm.
"""

from __future__ import annotations

import threading
from functools import partial

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.helpers.models import mlp
from tests.helpers.recording import problems, record, spans
from tests.helpers.training import train

torch.manual_seed(0)


def test_mlp_forward_and_backward_are_nested_in_order() -> None:
    model = mlp()
    events, _ = record(lambda: model(torch.randn(3, 8)).sum().backward())
    assert problems(events) == []
    assert [e.short() for e in events] == [
        ("enter", "forward", "Sequential"),
        ("enter", "forward", "Sequential.0"),
        ("exit", "forward", "Sequential.0"),
        ("enter", "forward", "Sequential.1"),
        ("exit", "forward", "Sequential.1"),
        ("enter", "forward", "Sequential.2"),
        ("exit", "forward", "Sequential.2"),
        ("exit", "forward", "Sequential"),
        # parent and last child share the output: one dispatch, parent first
        ("enter", "backward", "Sequential"),
        ("enter", "backward", "Sequential.2"),
        ("exit", "backward", "Sequential.2"),
        ("enter", "backward", "Sequential.1"),
        ("exit", "backward", "Sequential.1"),
        ("enter", "backward", "Sequential.0"),
        # the input needs no grad: closed when the graph task ends, innermost first
        ("exit", "backward", "Sequential.0"),
        ("exit", "backward", "Sequential"),
    ]
    fwd = {e.fqn: e.call_id for e in events if e.phase == "forward"}
    bwd = {e.fqn: e.call_id for e in events if e.phase == "backward"}
    assert fwd == bwd  # backward rows refer to their forward call
    assert len(set(fwd.values())) == 4
    # rows produced by one hook dispatch after its first are marked as ties
    assert [e.tie for e in events if e.phase == "backward"] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert {e.device for e in events} == {"cpu"}
    assert {e.stream for e in events} == {None}
    assert [e.status for e in events][-2:] == ["closed_at_end_of_backward"] * 2
    assert all(e.status == "ok" for e in events[:-2])
    ts = [e.ts for e in events]
    assert ts == sorted(ts)
    assert {e.task for e in events if e.phase == "forward"} == {None}
    assert len({e.task for e in events if e.phase == "backward"}) == 1


def test_input_requiring_grad_closes_every_backward_by_hook() -> None:
    model = mlp()
    x = torch.randn(3, 8, requires_grad=True)
    events, _ = record(lambda: model(x).sum().backward())
    assert problems(events) == []
    assert {e.status for e in events} == {"ok"}
    # first layer and root exit together once the input's gradient is ready
    assert [e.short() for e in events][-2:] == [("exit", "backward", "Sequential.0"), ("exit", "backward", "Sequential")]


def test_sibling_branches_sharing_an_input_do_not_nest_in_each_other() -> None:
    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(4, 4) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.o(self.q(x) * self.k(x) + self.v(x))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(4)
            self.attn = Attn()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.attn(self.ln(x))

    model = Block()
    events, _ = record(lambda: model(torch.randn(2, 4, requires_grad=True)).sum().backward())
    assert problems(events) == []
    depth = dict(spans(events, "backward"))
    assert depth == {"Block": 0, "Block.attn": 1, "Block.attn.o": 2, "Block.attn.v": 2, "Block.attn.k": 2, "Block.attn.q": 2, "Block.ln": 1}


def test_weight_sharing_and_self_calling_module() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(torch.relu(self.lin(x)))

    class Recursive(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)
            self.ran = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not self.ran:
                self.ran = True
                return self(x)
            self.ran = False
            return self.inner(x)

    shared = Shared()
    events, _ = record(lambda: shared(torch.randn(2, 4, requires_grad=True)).sum().backward())
    assert problems(events) == []
    lin_calls = [e.call_id for e in events if e.fqn == "Shared.lin" and e.kind == "enter" and e.phase == "forward"]
    assert len(set(lin_calls)) == 2
    assert sorted(e.call_id for e in events if e.fqn == "Shared.lin" and e.kind == "enter" and e.phase == "backward") == sorted(lin_calls)

    rec = Recursive()
    events, _ = record(lambda: rec(torch.rand(1, 2, requires_grad=True)).sum().backward())
    assert problems(events) == []
    assert spans(events, "forward") == [("Recursive", 0), ("Recursive", 1), ("Recursive.inner", 2)]
    assert spans(events, "backward") == [("Recursive", 0), ("Recursive", 1), ("Recursive.inner", 2)]
    outer, inner = [e.call_id for e in events if e.fqn == "Recursive" and e.kind == "enter" and e.phase == "forward"]
    assert outer != inner


def test_forward_that_raises_records_error_exits_and_cancels_its_backward() -> None:
    class Boom(Exception):
        pass

    class Flaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.fail = True
            self.kept: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            self.kept = h
            if self.fail:
                raise Boom("bad batch")
            return self.b(h)

    model = Flaky()

    def run() -> None:
        with pytest.raises(Boom):
            model(torch.randn(2, 4))
        assert model.kept is not None
        model.kept.sum().backward()  # the failed call's graph: its module hooks are cancelled
        model.fail = False
        model(torch.randn(2, 4)).sum().backward()

    events, _ = record(run)
    assert problems(events) == []
    first = events[:4]
    assert [(e.short(), e.status) for e in first] == [
        (("enter", "forward", "Flaky"), "ok"),
        (("enter", "forward", "Flaky.a"), "ok"),
        (("exit", "forward", "Flaky.a"), "ok"),
        (("exit", "forward", "Flaky"), "error"),
    ]
    failed_calls = {e.call_id for e in first}
    assert not [e for e in events if e.phase == "backward" and e.call_id in failed_calls]
    later = events[4:]
    assert {e.status for e in later if e.phase == "forward"} == {"ok"}
    assert {e.fqn for e in later if e.phase == "backward"} == {"Flaky", "Flaky.a", "Flaky.b"}


def _checkpointed(reentrant: bool) -> nn.Module:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(2)])
            self.head = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=reentrant)
            return self.head(x)

    return Net()


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recompute_is_linked_to_the_original_call(reentrant: bool) -> None:
    model = _checkpointed(reentrant)
    x = torch.randn(2, 4, requires_grad=True)
    events, _ = record(lambda: model(x).sum().backward())
    assert problems(events) == []
    fwd = {(e.fqn): e.call_id for e in events if e.phase == "forward" and e.kind == "enter"}
    rec = [e for e in events if e.phase == "recompute" and e.kind == "enter"]
    recomputed = {e.fqn for e in rec}
    assert {"Net.blocks.0", "Net.blocks.0.0", "Net.blocks.1", "Net.blocks.1.0"} <= recomputed
    assert recomputed <= {f"Net.blocks.{i}{s}" for i in range(2) for s in ("", ".0", ".1")}
    for e in rec:
        assert e.call_id == fwd[e.fqn], f"recompute of {e.fqn} not linked to its forward"
    bwd = {e.fqn for e in events if e.phase == "backward"}
    assert {"Net.blocks.0.0", "Net.blocks.1.0", "Net.blocks.0", "Net.blocks.1", "Net.head", "Net"} <= bwd
    if not reentrant:
        # non-reentrant recompute stops once it has what it needs
        assert "early_stop" in {e.status for e in events if e.phase == "recompute" and e.kind == "exit"}
    else:
        # reentrant: the original forward ran under no_grad; backward runs in a nested graph task
        assert len({e.task for e in events if e.phase == "backward"}) == 3


def test_tuple_and_dict_outputs_and_an_unused_submodule() -> None:
    class Multi(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.unused = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            h = self.lin(x)
            self.unused(x)  # output thrown away
            return h, {"mask": (h > 0).float(), "h2": h * 2}

    class Top(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.multi = Multi()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h, extra = self.multi(x)
            return (h + extra["h2"] * extra["mask"]).sum()

    model = Top()
    events, _ = record(lambda: model(torch.randn(2, 4, requires_grad=True)).backward())
    assert problems(events) == []
    assert {e.fqn for e in events if e.phase == "backward"} == {"Top", "Top.multi", "Top.multi.lin"}
    assert {e.fqn for e in events if e.phase == "forward"} == {"Top", "Top.multi", "Top.multi.lin", "Top.multi.unused"}


def test_no_grad_and_inference_mode_record_forward_only() -> None:
    model = mlp()

    def run() -> None:
        with torch.no_grad():
            model(torch.randn(2, 8))
        with torch.inference_mode():
            model(torch.randn(2, 8))
        model(torch.randn(2, 8, requires_grad=True)).sum().backward()

    events, _ = record(run)
    assert problems(events) == []
    calls = [e for e in events if e.fqn == "Sequential" and e.kind == "enter" and e.phase == "forward"]
    assert len(calls) == 3
    backward_calls = {e.call_id for e in events if e.phase == "backward"}
    assert calls[0].call_id not in backward_calls and calls[1].call_id not in backward_calls
    assert calls[2].call_id in backward_calls


def test_grad_inside_forward_double_backward_leaf_grad_and_retain_graph() -> None:
    class GradInside(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            (g,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
            return y + g

    model = GradInside()
    lin = nn.Linear(3, 1)

    def run() -> None:
        x = torch.randn(2, 3, requires_grad=True)
        out = model(x).sum()
        (gx,) = torch.autograd.grad(out, x, create_graph=True)  # grad w.r.t. a leaf input
        gx.sum().backward()  # double backward
        y = lin(torch.randn(2, 3, requires_grad=True)).sum()
        y.backward(retain_graph=True)
        y.backward()

    events, _ = record(run)
    assert problems(events) == []
    lin_tasks = [e.task for e in events if e.fqn == "Linear" and e.phase == "backward" and e.kind == "enter"]
    assert len(lin_tasks) == 2 and lin_tasks[0] != lin_tasks[1]  # one backward pass per graph task


def test_two_roots_and_keyword_tensors() -> None:
    class KW(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, *, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    model, loss_fn = KW(), nn.MSELoss()
    events, _ = record(lambda: loss_fn(model(x=torch.randn(2, 4, requires_grad=True)), torch.zeros(2, 4)).backward())
    assert problems(events) == []
    bw = [e.short() for e in events if e.phase == "backward"]
    assert bw[0] == ("enter", "backward", "MSELoss")
    assert ("enter", "backward", "KW") in bw and ("exit", "backward", "KW") in bw
    # KW's keyword input needs grad: its backward exit comes from a hook, not the end of the task
    kw_exit = [e for e in events if e.fqn == "KW" and e.phase == "backward" and e.kind == "exit"]
    assert kw_exit[0].status == "ok"


def test_two_roots_of_one_class_are_disambiguated() -> None:
    a, b = mlp(), mlp()

    def run() -> None:
        a(torch.randn(1, 8))
        b(torch.randn(1, 8))
        a(torch.randn(1, 8))

    events, _ = record(run)
    roots = [e.fqn for e in events if e.kind == "enter" and "." not in e.fqn]
    assert roots == ["Sequential", "Sequential#1", "Sequential"]


def test_threads_have_separate_stacks() -> None:
    models = [mlp(), mlp()]
    barrier = threading.Barrier(2)

    def work(m: nn.Module) -> None:
        barrier.wait()
        for _ in range(20):
            m(torch.randn(2, 8, requires_grad=True)).sum().backward()

    def run() -> None:
        threads = [threading.Thread(target=work, args=(m,)) for m in models]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    events, _ = record(run)
    assert problems(events) == []
    assert len({e.thread for e in events}) == 2
    for tid in {e.thread for e in events}:
        roots = {e.fqn for e in events if e.thread == tid and "." not in e.fqn}
        assert len(roots) == 1  # each thread saw only its own model


@pytest.mark.parametrize("how", ["torch.compile", "Module.compile"])
def test_compiled_models_do_not_crash_or_record_compiler_internals(how: str) -> None:
    model = mlp()
    if how == "torch.compile":
        compiled = torch.compile(model, backend="eager")
    else:
        model.compile(backend="eager")
        compiled = model

    def run() -> None:
        for _ in range(2):
            compiled(torch.randn(2, 8, requires_grad=True)).sum().backward()

    events, _ = record(run)
    assert problems(events) == []
    assert not [e for e in events if "_orig_mod" in e.fqn or "OptimizedModule" in e.fqn]
    assert {e.fqn.split(".")[0] for e in events} <= {"Sequential"}


def test_backward_after_the_context_records_nothing() -> None:
    model = mlp()
    kept: list[torch.Tensor] = []
    events, tracker = record(lambda: kept.append(model(torch.randn(2, 8, requires_grad=True)).sum()))
    n = len(events)
    assert not tracker.active
    kept[0].backward()  # hooks on the retained graph are inert now
    assert n == 8
    assert [e for e in events if e.phase == "backward"] == []


def test_a_child_added_after_its_parent_was_named_gets_its_path() -> None:
    class Grows(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not hasattr(self, "late"):
                self.late = nn.Linear(2, 2)
            return self.late(self.first(x))

    model = Grows()
    events, _ = record(lambda: model(torch.randn(1, 2)))
    assert [e.fqn for e in events if e.kind == "enter"] == ["Grows", "Grows.first", "Grows.late"]


def test_two_trackers_at_once_each_see_every_call() -> None:
    from modtrace.tracking.tracker import Tracker
    from tests.helpers.recording import FakeClock, decode

    model = mlp()
    rows_a: list[tuple[object, ...]] = []
    rows_b: list[tuple[object, ...]] = []
    a = Tracker(rows_a.append, clock=FakeClock())
    b = Tracker(rows_b.append, clock=FakeClock())
    a.start()
    b.start()
    try:
        model(torch.randn(2, 8, requires_grad=True)).sum().backward()
    finally:
        b.stop()
        a.stop()
    ev_a, ev_b = decode(a, rows_a), decode(b, rows_b)
    assert problems(ev_a) == [] and problems(ev_b) == []
    assert [e.short() for e in ev_a] == [e.short() for e in ev_b]
    assert len([e for e in ev_a if e.phase == "backward"]) == 8



# -- backward nesting follows the forward call tree -----------------------------


class Borrows(nn.Module):
    """Calls a module it does not own (kept in a plain list) on its child's output."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self._borrowed = [nn.Linear(4, 4)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._borrowed[0](self.inner(x))


class BuildsItsLoss(nn.Module):
    """Returns the output of a loss module it creates on every call (the Hugging Face pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.CrossEntropyLoss()(self.body(x), labels)


class Owner(nn.Module):
    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        self.lin = lin
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.act(x))


class SharedByTwo(nn.Module):
    """One Linear registered under two owners; a dict and a plain object lend two more."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(4, 4)
        self.first = Owner(shared)
        self.second = Owner(shared)
        self.table = {"scale": nn.Linear(4, 4)}
        self.holder = type("Holder", (), {})()
        self.holder.norm = nn.LayerNorm(4)
        object.__setattr__(self, "loss_fn", nn.MSELoss())  # a loss module it calls but does not register

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.holder.norm(self.table["scale"](self.second(self.first(x))))
        return self.loss_fn(h, torch.zeros_like(h))


@pytest.mark.parametrize("case", ["borrowed", "built_in_forward", "shared_and_lent"])
def test_backward_nests_by_the_forward_call_tree(case: str) -> None:
    from tests.helpers.recording import analysis_moves_rows, decode, record_rows

    x = torch.randn(2, 4, requires_grad=True)
    model: nn.Module
    if case == "borrowed":
        model = Borrows()
        run = partial(train, model, 3, loss=lambda m: m(x).sum(), lr=None)
        expected = [("Borrows", 0), ("Linear", 1), ("Borrows.inner", 1)]
    elif case == "built_in_forward":
        model = BuildsItsLoss()
        labels = torch.tensor([0, 2])
        run = partial(train, model, 3, loss=lambda m: m(x, labels), lr=None)
        expected = [("BuildsItsLoss", 0), ("CrossEntropyLoss", 1), ("BuildsItsLoss.body", 1),
                    ("BuildsItsLoss.body.2", 2), ("BuildsItsLoss.body.1", 2), ("BuildsItsLoss.body.0", 2)]
    else:
        model = SharedByTwo()
        run = partial(train, model, 3, loss=lambda m: m(x), lr=None)
        expected = [("SharedByTwo", 0), ("MSELoss", 1), ("LayerNorm", 1), ("Linear", 1),
                    ("SharedByTwo.second", 1), ("SharedByTwo.first.lin", 2), ("SharedByTwo.second.act", 2),
                    ("SharedByTwo.first", 1), ("SharedByTwo.first.lin", 2), ("SharedByTwo.first.act", 2)]
    rows, tracker = record_rows(run)
    events = decode(tracker, rows)
    assert problems(events) == []
    steps = [[(f, d) for f, d in spans([e for e in events if e.task == task], "backward")]
             for task in sorted({e.task for e in events if e.phase == "backward"})]
    assert len(steps) == 3
    assert all(step == expected for step in steps), steps
    # every backward exit comes after its own enter, and the analysis keeps that order
    assert analysis_moves_rows(tracker, rows) == []
    fwd_calls = {e.call_id for e in events if e.phase == "forward"}
    assert {e.call_id for e in events if e.phase == "backward"} <= fwd_calls


def test_a_module_built_in_every_forward_keeps_one_name_and_one_module_id() -> None:
    import gc

    from modtrace.tracking.tracker import Tracker
    from tests.helpers.recording import FakeClock, decode

    model = BuildsItsLoss()
    x, labels = torch.randn(2, 4), torch.tensor([1, 0])
    rows: list[tuple[object, ...]] = []
    tracker = Tracker(rows.append, clock=FakeClock())
    counts: list[int] = []
    tracker.start()
    try:
        for _ in range(5):
            model(x, labels).backward()
            gc.collect()
            counts.append(len(tracker.fqns))
    finally:
        tracker.stop()
    events = decode(tracker, rows)
    loss_ids = {r[3] for r in rows if tracker.fqns[r[3]].startswith("CrossEntropyLoss")}
    assert {tracker.fqns[i] for i in loss_ids} == {"CrossEntropyLoss"}
    assert len(loss_ids) == 1
    assert counts == [counts[0]] * 5  # no new modules row after the first step
    assert [m[1] for m in tracker.new_modules].count("CrossEntropyLoss") == 1
    assert problems(events) == []


def test_two_live_roots_of_one_class_and_a_freed_name() -> None:
    import gc

    a, b = mlp(), mlp()

    def run() -> None:
        nonlocal a
        a(torch.randn(1, 8))
        b(torch.randn(1, 8))
        a(torch.randn(1, 8))
        c = mlp()
        c(torch.randn(1, 8))  # a and b alive: the next free number
        del a
        gc.collect()
        d = mlp()
        d(torch.randn(1, 8))  # a's name was freed: the lowest free one
        del c
        gc.collect()
        e = mlp()
        e(torch.randn(1, 8))

    events, tracker = record(run)
    roots = [e.fqn for e in events if e.kind == "enter" and "." not in e.fqn]
    assert roots == ["Sequential", "Sequential#1", "Sequential", "Sequential#2", "Sequential", "Sequential#2"]
    # a name keeps one module id: d reuses a's ids, e reuses c's
    assert len(tracker.new_modules) == 3 * 4
    assert [m[1] for m in tracker.new_modules if "." not in m[1]] == ["Sequential", "Sequential#1", "Sequential#2"]


# -- no silent limits ----------------------------------------------------------------


def test_recompute_links_every_call_of_a_module_called_many_times() -> None:
    class Loop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(300):
                x = torch.tanh(self.lin(x))
            return x

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.loop = Loop()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.loop, x, use_reentrant=True)

    model = Net()
    events, _ = record(lambda: model(torch.randn(2, 4, requires_grad=True)).sum().backward())
    fwd = [e.call_id for e in events if e.phase == "forward" and e.kind == "enter" and e.fqn == "Net.loop.lin"]
    rec = [e.call_id for e in events if e.phase == "recompute" and e.kind == "enter" and e.fqn == "Net.loop.lin"]
    assert len(fwd) == 300
    assert rec == fwd  # each recomputed call linked to its own forward call, in order
    assert problems(events) == []


def test_backward_of_calls_inside_many_failed_forwards_never_records() -> None:
    class Boom(Exception):
        pass

    class Flaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.kept: list[torch.Tensor] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.kept.append(self.a(x))
            raise Boom

    model = Flaky()

    def run() -> None:
        for _ in range(100):
            with pytest.raises(Boom):
                model(torch.randn(2, 4))
        torch.stack(model.kept).sum().backward()

    events, _ = record(run)
    assert [e for e in events if e.phase == "backward"] == []
    assert problems(events) == []


def test_tensors_deep_in_an_output_get_their_backward() -> None:
    class Deep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> object:
            out: object = self.lin(x)
            for _ in range(8):
                out = {"nested": [out]}
            return out

    class Top(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.deep = Deep()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.deep(x)
            for _ in range(8):
                out = out["nested"][0]  # type: ignore[index]
            return out.sum()  # type: ignore[attr-defined, no-any-return]

    model = Top()
    events, _ = record(lambda: model(torch.randn(2, 4, requires_grad=True)).backward())
    assert problems(events) == []
    assert spans(events, "backward") == [("Top", 0), ("Top.deep", 1), ("Top.deep.lin", 2)]


class PassesThrough(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _rows_both_ways(run: object) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """The rows ``run`` gives with the node hooks' usual-node path, and with every node
    dispatched by the general one (forced: a forward that raised makes every node take it;
    no call here is inside one, so none is cancelled).  Graph task ids are numbered in
    order of appearance: each backward gets a new one."""
    from modtrace.tracking.tracker import Tracker
    from tests.helpers.recording import FakeClock

    out = []
    for general in (False, True):
        rows: list[tuple[object, ...]] = []
        tracker = Tracker(rows.append, clock=FakeClock())
        tracker.start()
        if general:
            tracker._failures = 1
        try:
            run()  # type: ignore[operator]
        finally:
            tracker.stop()
        tasks: dict[object, int] = {}
        out.append([(*r[:11], None if r[11] is None else tasks.setdefault(r[11], len(tasks)), r[12]) for r in rows])
    return out[0], out[1]


@pytest.mark.parametrize("case", ["mlp", "identity", "checkpoint", "borrowed", "built_in_forward", "shared_and_lent"])
def test_the_usual_node_path_writes_the_rows_the_general_dispatch_writes(case: str) -> None:
    x = torch.randn(2, 4, requires_grad=True)
    if case == "mlp":
        model: nn.Module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        run = partial(train, model, 3, loss=lambda m: m(x).sum(), lr=None)
    elif case == "identity":
        model = nn.Sequential(nn.Linear(4, 4), PassesThrough(), nn.ReLU(), PassesThrough())
        run = partial(train, model, 3, loss=lambda m: m(x).sum(), lr=None)
    elif case == "checkpoint":
        inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        run = partial(train, inner, 3, loss=lambda m: checkpoint(m, x, use_reentrant=False).sum(), lr=None)
    elif case == "borrowed":
        model = Borrows()
        run = partial(train, model, 3, loss=lambda m: m(x).sum(), lr=None)
    elif case == "built_in_forward":
        model = BuildsItsLoss()
        labels = torch.tensor([0, 2])
        run = partial(train, model, 3, loss=lambda m: m(x, labels), lr=None)
    else:
        model = SharedByTwo()
        run = partial(train, model, 3, loss=lambda m: m(x), lr=None)
    usual, general = _rows_both_ways(run)
    assert sum(1 for r in usual if r[4] == 1) >= 4  # backward rows were written
    assert usual == general
