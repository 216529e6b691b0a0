"""A run of a compiled model written as the recorder writes one: real event rows through the
store's writer, with the compiled module's inner calls attributed from its kernels (status
attributed) or not recorded at all.

Each step: ``Net`` (compiled) forward from 0 to 1000 ns, and inside it, when attributed,
``Net.block`` (100 to 900) holding ``Net.block.attn`` (100 to 400) and ``Net.block.mlp``
(400 to 900); the backward the same shape, twice as long.  ``hooked_attn_step``: the step
whose forward ``attn`` call was measured by hooks instead (status ok), so that node is mixed.
``EXPECTED`` lists what those times make of each span, written out from the layout above.
"""

from __future__ import annotations

from typing import Any

from modtrace.core.codes import Kind, Phase, Status
from modtrace.core.contracts import Batch
from modtrace.store.engine import open_store
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.writer import EVENT_COLUMNS, RankWriter

STEPS = 2
STEP_NS = 10_000
# (module_id, fqn, module_type, parent_module_id, compiled)
MODULES = [
    (0, "Net", "Net", None, 1),
    (1, "Net.block", "Block", 0, 0),
    (2, "Net.block.attn", "MultiheadAttention", 1, 0),
    (3, "Net.block.mlp", "MLP", 1, 0),
]
# (module_id, start, end) of one forward, in ns from the step's forward start; the backward is
# the same, each time doubled, after it.
LAYOUT = [(0, 0, 1000), (1, 100, 900), (2, 100, 400), (3, 400, 900)]
BACKWARD_AT = 2000
# (fqn, phase) -> (duration_ns, self_ns, status) of each step's span
EXPECTED = {
    ("Net", "forward"): (1000, 200, "ok"),
    ("Net.block", "forward"): (800, 0, "attributed"),
    ("Net.block.attn", "forward"): (300, 300, "attributed"),
    ("Net.block.mlp", "forward"): (500, 500, "attributed"),
    ("Net", "backward"): (2000, 400, "ok"),
    ("Net.block", "backward"): (1600, 0, "attributed"),
    ("Net.block.attn", "backward"): (600, 600, "attributed"),
    ("Net.block.mlp", "backward"): (1000, 1000, "attributed"),
}


def _rows(attributed: bool, hooked_attn_step: int | None) -> list[tuple[Any, ...]]:
    marks: list[tuple[int, int, int, int, int, int, int | None]] = []  # (ts, order, kind, module, phase, step, task)
    for step in range(STEPS):
        base = step * STEP_NS
        for phase, at, scale in ((Phase.FORWARD, 0, 1), (Phase.BACKWARD, BACKWARD_AT, 2)):
            task = None if phase == Phase.FORWARD else 100 + step
            for module, start, end in LAYOUT:
                if module and not attributed:
                    continue
                # at equal times an exit comes before the next enter, and enters outermost first
                marks.append((base + at + start * scale, 1, Kind.ENTER, module, phase, step, task))
                marks.append((base + at + end * scale, 0, Kind.EXIT, module, phase, step, task))
    # exits innermost first at equal times: the later-entered (higher module id here) first
    marks.sort(key=lambda m: (m[0], m[1], m[3] if m[2] == Kind.ENTER else -m[3]))
    rows = []
    for seq, (ts, _, kind, module, phase, step, task) in enumerate(marks):
        status = Status.ATTRIBUTED if module else Status.OK
        if module == 2 and phase == Phase.FORWARD and step == hooked_attn_step:
            status = Status.OK
        row = {"seq": seq, "ts_ns": ts, "kind": int(kind), "module_id": module, "phase": int(phase),
               "call_id": step * 10 + module, "step": step, "thread_id": 0, "device_id": 0, "stream": None,
               "status": int(status), "graph_task": task, "tie": 0}
        rows.append(tuple(row[c] for c in EVENT_COLUMNS))
    return rows


def write_compiled_run(db: str, name: str, *, attributed: bool = True, hooked_attn_step: int | None = None) -> int:
    """Write a completed one-rank run of the compiled model to ``db``; its run id."""
    store = open_store(db, create=True)
    try:
        run_id, _ = create_run(store, name, {"world_size": 1})
        add_rank(store, run_id, 0, 0)
        rows = _rows(attributed, hooked_attn_step)
        RankWriter(store, run_id, 0).write(Batch(rows, MODULES, [(0, 1, "MainThread")], [(0, "cpu")],
                                                 progress=(len(rows), STEPS)))
        finish_rank(store, run_id, 0, "completed")
    finally:
        store.dispose()
    return run_id
