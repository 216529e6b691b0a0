"""Synthetic event streams for the analysis tests, and a plain stack oracle.

``Stream`` builds rows in the recorder's event contract (EVENT_COLUMNS order)
from nested calls, so tests can write well-nested streams by hand or at
random; ``tie_shuffle`` turns hierarchy-ordered hook dispatches into the
order autograd fires them; ``oracle_spans`` is the straightforward stack
reconstruction the vectorised rebuild must equal.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from modtrace.core.codes import Kind, Phase, Status
from modtrace.core.contracts import Batch
from modtrace.store.engine import open_store
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.writer import RankWriter

ENTER, EXIT = int(Kind.ENTER), int(Kind.EXIT)


@dataclass
class Modules:
    """A module tree: ids, fqns, parents."""

    rows: list[tuple[int, str, str, int | None]] = field(default_factory=list)

    def add(self, fqn: str, parent: int | None, module_type: str = "Linear") -> int:
        mid = len(self.rows)
        self.rows.append((mid, fqn, module_type, parent))
        return mid

    def children(self, mid: int) -> list[int]:
        return [m for m, _, _, p in self.rows if p == mid]

    def frame(self, rank: int = 0) -> pl.DataFrame:
        return pl.DataFrame(
            [(rank, *r) for r in self.rows],
            schema=["rank", "module_id", "fqn", "module_type", "parent_module_id"],
            orient="row",
        )


def model(blocks: int = 2, per_block: int = 2) -> Modules:
    mods = Modules()
    root = mods.add("Net", None, "Net")
    for b in range(blocks):
        blk = mods.add(f"Net.blocks.{b}", root, "Block")
        for c in range(per_block):
            mods.add(f"Net.blocks.{b}.fc{c}", blk, "Linear")
    mods.add("Net.head", root, "Linear")
    return mods


# One event as a dict before seq/tie are assigned.
Event = dict[str, Any]


def ev(kind: int, module: int, phase: int, call: int, *, step: int = 0, thread: int = 0,
       status: int = 0, graph_task: int | None = None, ts: int | None = None) -> Event:
    return {"kind": kind, "module_id": module, "phase": phase, "call_id": call, "step": step,
            "thread_id": thread, "status": status, "graph_task": graph_task, "ts": ts}


def nested_calls(mods: Modules, mid: int, phase: int, calls: dict[int, int], rng: random.Random,
                 *, step: int = 0, thread: int = 0, graph_task: int | None = None,
                 max_children: int = 3) -> list[Event]:
    """Enter/exit events of a call of ``mid`` and (some of) its children, properly nested.

    ``calls`` maps module id to the call id to use (forward allocates new ones)."""
    call = calls.setdefault(mid, len(calls) + 1000 * (step + 1))
    out = [ev(ENTER, mid, phase, call, step=step, thread=thread, graph_task=graph_task)]
    kids = mods.children(mid)
    for kid in rng.sample(kids, k=min(len(kids), rng.randint(0, max_children))):
        out += nested_calls(mods, kid, phase, calls, rng, step=step, thread=thread,
                            graph_task=graph_task, max_children=max_children)
    out.append(ev(EXIT, mid, phase, call, step=step, thread=thread, graph_task=graph_task))
    return out


def tie_groups(events: list[Event], rng: random.Random) -> list[list[Event]]:
    """Split one thread's hierarchy-ordered events into hook dispatches: a run of
    exits then a run of enters, each possibly longer than one row."""
    groups: list[list[Event]] = []
    i = 0
    while i < len(events):
        group = [events[i]]
        i += 1
        seen_enter = group[0]["kind"] == ENTER
        while i < len(events) and rng.random() < 0.6:
            nxt = events[i]
            if nxt["kind"] == EXIT and seen_enter:
                break
            # Forward and recompute rows come from module hooks, one per dispatch.
            if nxt["phase"] != Phase.BACKWARD or group[0]["phase"] != Phase.BACKWARD:
                break
            if nxt["graph_task"] != group[0]["graph_task"]:
                break
            seen_enter = seen_enter or nxt["kind"] == ENTER
            group.append(nxt)
            i += 1
        groups.append(group)
    return groups


def tie_shuffle(groups: list[list[Event]], rng: random.Random) -> list[list[Event]]:
    """Each dispatch's rows in a random firing order, tie=1 after the first."""
    out = []
    for g in groups:
        g = list(g)
        rng.shuffle(g)
        out.append([{**e, "tie": 0 if k == 0 else 1} for k, e in enumerate(g)])
    return out


def interleave(threads: list[list[list[Event]]], rng: random.Random) -> list[Event]:
    """Merge threads' dispatches in random order (a dispatch stays contiguous within its thread)."""
    pos = [0] * len(threads)
    flat: list[Event] = []
    live = [t for t in range(len(threads)) if threads[t]]
    while live:
        t = rng.choice(live)
        flat.extend(threads[t][pos[t]])
        pos[t] += 1
        if pos[t] == len(threads[t]):
            live.remove(t)
    return flat


def to_rows(events: list[Event], rng: random.Random | None = None, start_seq: int = 0) -> list[tuple[Any, ...]]:
    """Events -> rows in RankWriter's EVENT_COLUMNS order, seq from ``start_seq`` and ts non-decreasing."""
    rows = []
    ts = 0
    for k, e in enumerate(events):
        if e.get("ts") is not None:
            ts = e["ts"]
        elif rng is not None:
            ts += rng.choice([0, 1, 5, 20])
        else:
            ts += 10
        rows.append((start_seq + k, ts, e["kind"], e["module_id"], e["phase"], e["call_id"], e["step"],
                     e["thread_id"], 0, None, e["status"], e["graph_task"], e.get("tie", 0)))
    return rows


ROW_COLUMNS = ("seq", "ts_ns", "kind", "module_id", "phase", "call_id", "step", "thread_id",
               "device_id", "stream", "status", "graph_task", "tie")


def frame(rows: list[tuple[Any, ...]], run_id: int = 1, rank: int = 0) -> pl.DataFrame:
    schema = {"seq": pl.Int64, "ts_ns": pl.Int64, "kind": pl.Int8, "module_id": pl.Int32, "phase": pl.Int8,
              "call_id": pl.Int64, "step": pl.Int32, "thread_id": pl.Int32, "device_id": pl.Int32,
              "stream": pl.Int64, "status": pl.Int8, "graph_task": pl.Int64, "tie": pl.Int8}
    return pl.DataFrame(rows, schema=schema, orient="row").with_columns(
        pl.lit(run_id, dtype=pl.Int32).alias("run_id"), pl.lit(rank, dtype=pl.Int32).alias("rank")
    )


def devices(rank: int = 0) -> pl.DataFrame:
    return pl.DataFrame({"rank": [rank], "device_id": [0], "name": ["cpu"]})


def training_step(mods: Modules, rng: random.Random, step: int, *, thread: int = 0, graph_task: int = 1,
                  recompute: int | None = None) -> tuple[list[Event], list[Event]]:
    """(forward events, backward events) of one step over the module tree; the
    backward repeats the forward's calls in reverse child order, and when
    ``recompute`` names a module called in forward its recompute runs nested
    inside that module's backward span."""
    calls: dict[int, int] = {}
    fwd = nested_calls(mods, 0, Phase.FORWARD, calls, rng, step=step, thread=thread)
    called = {e["module_id"]: e["call_id"] for e in fwd}

    def backward(mid: int) -> list[Event]:
        call = called[mid]
        out = [ev(ENTER, mid, Phase.BACKWARD, call, step=step, thread=thread, graph_task=graph_task)]
        if recompute is not None and mid == recompute:
            out += nested_calls(mods, mid, Phase.RECOMPUTE, dict(called), rng, step=step, thread=thread,
                                graph_task=graph_task)
        kids = [k for k in mods.children(mid) if k in called]
        for kid in reversed(kids):
            out += backward(kid)
        out.append(ev(EXIT, mid, Phase.BACKWARD, call, step=step, thread=thread, graph_task=graph_task))
        return out

    return fwd, backward(0)


def module_depth(mods_frame: pl.DataFrame) -> dict[tuple[int, int], int]:
    parent = {(r, m): p for r, m, p in mods_frame.select("rank", "module_id", "parent_module_id").iter_rows()}
    out = {}
    for (r, m) in parent:
        d, cur = 0, parent[(r, m)]
        while cur is not None:
            d, cur = d + 1, parent[(r, cur)]
        out[(r, m)] = d
    return out


def oracle_spans(events: pl.DataFrame, mods_frame: pl.DataFrame) -> list[tuple[Any, ...]]:
    """The plain reconstruction: per thread, order each dispatch (exits by latest
    opened first, then enters by module depth), then push and pop one stack per
    (rank, thread, graph task of backward/recompute rows).  Returns sorted
    (rank, span_id, parent, depth, exit_seq, start, end, duration, self, status)."""
    depth_of = module_depth(mods_frame)
    cols = ["rank", "seq", "ts_ns", "kind", "module_id", "phase", "call_id", "thread_id", "status", "graph_task", "tie"]
    rows = events.sort("rank", "seq").select(cols).rows()
    # Dispatches per (rank, thread), then re-laid into their seq slots.
    per_thread: dict[tuple[int, int], list[list[tuple[Any, ...]]]] = {}
    for r in rows:
        groups = per_thread.setdefault((r[0], r[7]), [])
        if r[10] == 1 and groups:
            groups[-1].append(r)
        else:
            groups.append([r])
    return _walk(per_thread, depth_of)


def _walk(per_thread: dict[tuple[int, int], list[list[tuple[Any, ...]]]],
          depth_of: dict[tuple[int, int], int]) -> list[tuple[Any, ...]]:
    all_groups = sorted((g for gs in per_thread.values() for g in gs), key=lambda g: (g[0][0], g[0][1]))
    opened: dict[tuple[int, int, int], int] = {}
    counter = 0
    placed: list[tuple[int, int, tuple[Any, ...]]] = []  # (rank, slot seq, row)
    for g in all_groups:
        exits = [r for r in g if r[3] == EXIT]
        enters = [r for r in g if r[3] == ENTER]
        exits.sort(key=lambda r: -opened.get((r[0], r[6], r[5]), -1))
        enters.sort(key=lambda r: (depth_of.get((r[0], r[4]), 0), r[1]))
        for r in enters:
            counter += 1
            opened[(r[0], r[6], r[5])] = counter
        for slot, r in zip(sorted(r[1] for r in g), exits + enters, strict=False):
            placed.append((r[0], slot, r))
    placed.sort(key=lambda x: (x[0], x[1]))
    stacks: dict[tuple[Any, ...], list[list[Any]]] = {}
    spans: dict[tuple[int, int], list[Any]] = {}
    for rank, _slot, r in placed:
        _, seq, ts, kind, _mod, phase, call, thread, status, gt, _ = r
        key = (rank, thread, None if phase == Phase.FORWARD else gt)
        stack = stacks.setdefault(key, [])
        if kind == ENTER:
            parent = stack[-1][0] if stack else None
            stack.append([seq, call, phase])
            spans[(rank, seq)] = [rank, seq, parent, len(stack) - 1, None, ts, None, status]
        else:
            top = stack.pop()
            assert (top[1], top[2]) == (call, phase), "oracle fed a stream that is not well nested"
            s = spans[(rank, top[0])]
            s[4], s[6], s[7] = seq, ts, status
    child_ns: dict[tuple[int, int], int] = {}
    for s in spans.values():
        if s[2] is not None and s[6] is not None:
            child_ns[(s[0], s[2])] = child_ns.get((s[0], s[2]), 0) + s[6] - s[5]
    out = []
    for (rank, seq), s in sorted(spans.items()):
        dur = None if s[6] is None else s[6] - s[5]
        self_ns = None if dur is None else dur - child_ns.get((rank, seq), 0)
        status = s[7] if s[4] is not None else None
        out.append((rank, seq, s[2], s[3], s[4], s[5], s[6], dur, self_ns, status))
    return out


def spans_as_tuples(spans: pl.DataFrame) -> list[tuple[Any, ...]]:
    return (
        spans.sort("rank", "span_id")
        .select("rank", "span_id", "parent_span_id", "depth", "exit_seq", "start_ns", "end_ns", "duration_ns",
                "self_ns", pl.col("status").to_physical().cast(pl.Int64))
        .rows()
    )


def _write_two_ranks(db: str) -> tuple[int, dict[int, pl.DataFrame]]:
    store = open_store(db, create=True)
    written = {}
    try:
        run_id, _ = create_run(store, "two", {"world_size": 2})
        mods = model(blocks=2, per_block=2)
        for rank in (0, 1):
            add_rank(store, run_id, rank, 0)
            rng = random.Random(rank)
            events = []
            for step in range(3):
                fwd, bwd = training_step(mods, rng, step, graph_task=10 + step, recompute=1)
                events += fwd + bwd
            rows = to_rows(events, rng)
            rows[3] = (*rows[3][:9], 2**40 + 7, *rows[3][10:])  # a large stream handle stays an int
            RankWriter(store, run_id, rank).write(Batch(
                rows, modules=mods.rows, threads=[(0, 99, "MainThread")], devices=[(0, "cpu")], progress=(len(rows), 3)
            ))
            written[rank] = frame(rows, run_id=run_id, rank=rank)
            finish_rank(store, run_id, rank, "completed")
    finally:
        store.dispose()
    return run_id, written


def _write_misnested(db: str) -> int:
    """Two ranks of two threads each, with tied backward dispatches, varied devices and
    streams, and a broken rank 1: an exit moved past its parent's (crossed), a stray exit
    (no_enter), an enter repeated (duplicate_enter) and calls never closed (a failed run)."""
    store = open_store(db, create=True)
    try:
        run_id, _ = create_run(store, "bad", {"world_size": 2})
        mods = model(blocks=3, per_block=2)
        for rank in (0, 1):
            add_rank(store, run_id, rank, 0)
            rng = random.Random(10 + rank)
            threads = []
            for thread in (0, 1):
                events = []
                for step in range(4):
                    fwd, bwd = training_step(mods, rng, step, thread=thread, graph_task=100 * thread + step,
                                             recompute=2)
                    events += fwd + bwd
                threads.append(tie_shuffle(tie_groups(events, rng), rng))
            rows = to_rows(interleave(threads, rng), rng)
            # Each row its own device and stream, so a span takes exactly its enter row's.
            rows = [(*r[:8], rng.choice([0, 1, None]), rng.choice([None, 7, 2**40 + rng.randrange(9)]), *r[10:])
                    for r in rows]
            if rank == 1:
                exits = [i for i, r in enumerate(rows) if r[2] == 1 and r[12] == 0]
                a = exits[5]
                rows[a], rows[a + 1] = (*rows[a][:2], *rows[a + 1][2:]), (*rows[a + 1][:2], *rows[a][2:])
                rows.insert(40, (0, *rows[exits[9]][1:]))  # a stray exit
                rows.insert(60, (0, *rows[3][1:]))  # an enter again
                del rows[-7:]  # the end lost: calls left open
                rows = [(k, *r[1:]) for k, r in enumerate(rows)]
            RankWriter(store, run_id, rank).write(Batch(
                rows, modules=mods.rows, threads=[(0, 99, "MainThread"), (1, 98, "worker")],
                devices=[(0, "cpu"), (1, "cuda:0")], progress=(len(rows), 4),
            ))
            finish_rank(store, run_id, rank, "completed" if rank == 0 else "failed")
    finally:
        store.dispose()
    return run_id


R = int(Phase.RECOMPUTE)


def _random_run(seed: int, steps: int, threads: int, recompute: bool) -> tuple[pl.DataFrame, Any]:
    rng = random.Random(seed)
    mods = model(blocks=rng.randint(1, 3), per_block=rng.randint(1, 3))
    per_thread: list[list[list[dict[str, Any]]]] = []
    for t in range(threads):
        dispatches: list[list[dict[str, Any]]] = []
        for step in range(steps):
            rc = rng.choice([m for m, *_ in mods.rows]) if recompute and rng.random() < 0.7 else None
            fwd, bwd = training_step(mods, rng, step, thread=t, graph_task=100 * t + step, recompute=rc)
            for e in fwd:
                e["call_id"] += 100_000 * t
            for e in bwd:
                e["call_id"] += 100_000 * t
            if rc is not None:
                # A recompute stops early now and then: its outer call closes EARLY_STOP.
                for e in bwd:
                    if e["phase"] == R and e["kind"] == EXIT and rng.random() < 0.3:
                        e["status"] = int(Status.EARLY_STOP)
            dispatches += [[e] for e in fwd]
            dispatches += tie_shuffle(tie_groups(bwd, rng), rng)
        per_thread.append(dispatches)
    rows = to_rows(interleave(per_thread, rng), rng)
    return frame(rows), mods
