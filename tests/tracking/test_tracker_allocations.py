"""What the hooks leave for Python's garbage collector.

Every object the hooks make and keep until the backward counts towards the
collector's young-generation passes, and the ones alive when a pass runs are
promoted, bringing on full passes over every object of the program.  So the
hooks keep, per module call, only what the backward needs: the call's record,
which is also the hook of its output node (held in the node's metadata dict),
and the call's two forward rows (in the sink).  Before, each call also left a
(call id, parent) pair and each node an entries tuple, a ``functools.partial``
and a bound method, and each node a hook object of its own with two lists.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modtrace.tracking.calls import Call, NodeHook
from modtrace.tracking.tracker import Tracker

BLOCKS = 50
CALLS = 1 + 2 * BLOCKS  # the Sequential and each of its children


def _new_objects(run: Callable[[], Any]) -> tuple[dict[str, int], Any]:
    """Objects the collector tracks that ``run`` made and left alive, by type."""
    gc.collect()
    gc.disable()
    try:
        before = {id(o) for o in gc.get_objects()}
        out = run()
        counts: dict[str, int] = {}
        for o in gc.get_objects():
            if id(o) not in before:
                name = type(o).__name__
                counts[name] = counts.get(name, 0) + 1
    finally:
        gc.enable()
    return counts, out


def _forward_counts() -> tuple[list[list[object]], dict[str, int], dict[str, int]]:
    """The rows a traced forward and backward wrote, and the objects a forward left alive
    without the tracker (bare) and with it (traced)."""
    model = nn.Sequential(*[m for _ in range(BLOCKS) for m in (nn.Linear(8, 8), nn.ReLU())])
    x = torch.randn(2, 8)
    bare, _ = _new_objects(lambda: model(x).sum())
    rows: list[tuple[object, ...]] = []
    tracker = Tracker(rows.append)
    tracker.start()
    try:
        model(x).sum().backward()  # modules named, lookup rows made
        rows.clear()
        traced, loss = _new_objects(lambda: model(x).sum())
        loss.backward()
    finally:
        tracker.stop()
    return [list(r) for r in rows], bare, traced


def test_a_forward_keeps_one_call_per_module_call_that_is_also_its_output_nodes_hook() -> None:
    # Counted in an interpreter of its own: the collector lists every thread's objects, and in
    # a full run threads that earlier tests leave behind are alive here (tqdm's monitor wakes
    # every 10 s and holds a bound method, a tuple and a lock as it waits again); counted with
    # the forward's, they failed this test in a full run and never alone.
    code = f"import json, runpy; print(json.dumps(runpy.run_path({__file__!r})['_forward_counts']()))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, bare, traced = json.loads(proc.stdout)
    assert len(rows) == 4 * CALLS  # every event written: enter and exit, forward and backward
    assert traced.get(Call.__name__) == CALLS
    # every node made by a call (ReLU's output is the next Linear's input) has that call for its hook
    assert traced.get(NodeHook.__name__, 0) == 0
    # no closure, bound method, pair or list per call or node
    assert "partial" not in traced and "method" not in traced
    assert traced.get("list", 0) <= 1, sorted(traced.items())
    extra = sum(traced.values()) - sum(bare.values())
    # per call: a Call and its 2 forward rows; per node: the node's Python object and
    # hooks dict (any node pre-hook has them) and its metadata dict
    assert extra <= CALLS * (1 + 2) + 2 * BLOCKS * (2 + 1) + 4, sorted(traced.items())


def test_the_call_record_the_forward_hook_builds_inline_is_the_one_call_makes() -> None:
    """The forward pre-hook stores a child call's fields itself (no ``__init__``
    call); the record must be the one ``Call(...)`` makes, field for field."""
    missing = object()
    slots = [s for s in Call.__slots__ if s != "__weakref__"]
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(2, 4, requires_grad=True)
    seen: dict[str, Any] = {}
    rows: list[tuple[object, ...]] = []
    tracker = Tracker(rows.append)

    def grab(mod: nn.Module, args: Any) -> None:  # runs after the tracker's pre-hook
        if mod is model[0]:
            frame = tracker._local.st.stack[-1]
            seen.update({s: getattr(frame, s, missing) for s in slots})
            made = Call(frame.module, tracker._names.by_id[id(mod)], frame.parent, frame.call_id,
                        frame.device_id, frame.phase, frame.task, frame.exit_nodes)
            seen["made"] = {s: getattr(made, s, missing) for s in slots}

    tracker.start()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(grab)
    try:
        model(x).sum().backward()
    finally:
        handle.remove()
        tracker.stop()
    made = seen.pop("made")
    assert seen == made
    assert seen["parent"] is not None and seen["exit_nodes"] is x and seen["bw_task"] == -1
