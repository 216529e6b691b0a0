#!/usr/bin/env python
"""Freeze a database at the current schema head, for the upgrade tests.

    .venv/bin/python scripts/make_frozen_db.py

Run this once when a schema revision is released (right after its migration
is final), and commit the file it writes: ``tests/data/frozen/<revision>.db``.
tests/store/test_migrations.py upgrades every frozen file to head and checks the
data survived, so each released schema stays upgradable forever.

A frozen file is never regenerated: the script refuses to overwrite one.
The data is small but touches every table and every code (kinds, phases,
statuses), with two runs and two ranks; host names, pids and paths are
fixed values so no machine detail is committed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlalchemy import update

from modtrace.core.codes import Kind, Phase, Status
from modtrace.core.contracts import Batch
from modtrace.store.counters import write_counters
from modtrace.store.engine import open_store, read_revision
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.schema import HEAD, run_ranks, runs
from modtrace.store.speeds import write_speeds
from modtrace.store.writer import EVENT_COLUMNS, RankWriter

FROZEN_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "frozen"

# (module_id, fqn, module_type, parent_module_id, compiled)
MODULES = [
    (0, "Net", "Net", None, 0),
    (1, "Net.encoder", "Sequential", 0, 1),
    (2, "Net.encoder.0", "Linear", 1, 0),
    (3, "Net.encoder.1", "ReLU", 1, 0),
    (4, "Net.head", "Linear", 0, 0),
]


def _events(steps: int) -> list[tuple[object, ...]]:
    """Forward, backward (with a tie and a closed-at-end exit), recompute, a backward call and an error exit."""
    rows: list[dict[str, object]] = []
    ts = 0
    call = 0

    def ev(kind: Kind, module: int, phase: Phase, call_id: int, step: int, *,
           status: Status = Status.OK, graph_task: int | None = None, tie: int = 0) -> None:
        nonlocal ts
        ts += 1_000
        rows.append({
            "seq": len(rows), "ts_ns": ts, "kind": int(kind), "module_id": module, "phase": int(phase),
            "call_id": call_id, "step": step, "thread_id": 0, "device_id": 0, "stream": None,
            "status": int(status), "graph_task": graph_task, "tie": tie,
        })

    for step in range(steps):
        calls = {m: call + m for m in range(5)}
        call += 5
        # forward: Net(encoder(0, 1), head)
        ev(Kind.ENTER, 0, Phase.FORWARD, calls[0], step)
        ev(Kind.ENTER, 1, Phase.FORWARD, calls[1], step)
        # the compiled encoder's inner calls (revision 0016): measured by hooks in step 0,
        # attributed from its kernels in step 1
        inner = Status.ATTRIBUTED if step == 1 else Status.OK
        for m in (2, 3):
            ev(Kind.ENTER, m, Phase.FORWARD, calls[m], step, status=inner)
            ev(Kind.EXIT, m, Phase.FORWARD, calls[m], step, status=inner)
        ev(Kind.EXIT, 1, Phase.FORWARD, calls[1], step)
        ev(Kind.ENTER, 4, Phase.FORWARD, calls[4], step)
        ev(Kind.EXIT, 4, Phase.FORWARD, calls[4], step)
        ev(Kind.EXIT, 0, Phase.FORWARD, calls[0], step)
        # backward, one graph task per step
        g = 100 + step
        ev(Kind.ENTER, 0, Phase.BACKWARD, calls[0], step, graph_task=g)
        ev(Kind.ENTER, 4, Phase.BACKWARD, calls[4], step, graph_task=g, tie=1)
        ev(Kind.EXIT, 4, Phase.BACKWARD, calls[4], step, graph_task=g)
        ev(Kind.ENTER, 1, Phase.BACKWARD, calls[1], step, graph_task=g, tie=1)
        # checkpointed encoder: recompute under its backward, stopped early
        ev(Kind.ENTER, 1, Phase.RECOMPUTE, calls[1], step, graph_task=g)
        ev(Kind.ENTER, 2, Phase.RECOMPUTE, calls[2], step, graph_task=g)
        ev(Kind.EXIT, 2, Phase.RECOMPUTE, calls[2], step, graph_task=g)
        ev(Kind.EXIT, 1, Phase.RECOMPUTE, calls[1], step, graph_task=g, status=Status.EARLY_STOP)
        # a module called by backward code (revision 0013): a call of its own
        ev(Kind.ENTER, 4, Phase.BACKWARD_CALL, 1000 + step, step, graph_task=g)
        ev(Kind.EXIT, 4, Phase.BACKWARD_CALL, 1000 + step, step, graph_task=g)
        ev(Kind.ENTER, 3, Phase.BACKWARD, calls[3], step, graph_task=g)
        ev(Kind.EXIT, 3, Phase.BACKWARD, calls[3], step, graph_task=g)
        ev(Kind.ENTER, 2, Phase.BACKWARD, calls[2], step, graph_task=g)
        ev(Kind.EXIT, 2, Phase.BACKWARD, calls[2], step, graph_task=g, status=Status.CLOSED_AT_END_OF_BACKWARD)
        ev(Kind.EXIT, 1, Phase.BACKWARD, calls[1], step, graph_task=g, status=Status.CLOSED_AT_END_OF_BACKWARD, tie=1)
        ev(Kind.EXIT, 0, Phase.BACKWARD, calls[0], step, graph_task=g, status=Status.CLOSED_AT_END_OF_BACKWARD, tie=1)
    # a last forward that raised, and an exit whose enter was never seen
    ev(Kind.ENTER, 0, Phase.FORWARD, call, steps)
    ev(Kind.EXIT, 0, Phase.FORWARD, call, steps, status=Status.ERROR)
    ev(Kind.EXIT, 4, Phase.FORWARD, call + 1, steps, status=Status.NO_ENTER)
    return [tuple(r[c] for c in EVENT_COLUMNS) for r in rows]


def _roots(events: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """Root calls (revision 0003): every forward enter of Net, with a kind."""
    seq, kind, module, phase, call = (EVENT_COLUMNS.index(c) for c in ("seq", "kind", "module_id", "phase", "call_id"))
    return [(e[seq], e[call], "x=4x16") for e in events
            if e[kind] == Kind.ENTER and e[module] == 0 and e[phase] == Phase.FORWARD]


def _device_rows(events: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """Device time and allocated bytes (revision 0005) for every event but the last two: (seq, device_ts_ns, mem_bytes)."""
    seq = EVENT_COLUMNS.index("seq")
    return [(e[seq], 5_000 + 1_500 * i, 4096 * (i % 7)) for i, e in enumerate(events[:-2])]


def _counters(events: list[tuple[object, ...]]) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """Work counters (revision 0015) of the first step, as the recorder writes them: a row per
    call and phase that ran ops (``store.counters.CALL_COUNTER_COLUMNS`` without run_id and
    rank), and the step's counted range with the ops run outside any module."""
    seq, kind, module, phase, call, step, task = (EVENT_COLUMNS.index(c) for c in (
        "seq", "kind", "module_id", "phase", "call_id", "step", "graph_task"))
    first = [e for e in events if e[step] == 0]
    calls = sorted({(e[call], e[phase], e[task]) for e in first if e[kind] == Kind.EXIT and e[module] in (2, 4)},
                   key=lambda c: (c[0], c[1], -1 if c[2] is None else c[2]))
    rows = [(c, p, g, 2048 * (i + 1), 512 * (i + 1), i + 1, i % 2) for i, (c, p, g) in enumerate(calls)]
    return rows, [(first[0][seq], first[-1][seq], 64, 256, 3, 1)]


def _meta(command: str) -> dict[str, object]:
    return {
        "command": command, "cwd": "/frozen", "hostname": "frozen-host", "pid": 1,
        "git_commit": None, "python_version": "3.11.0", "torch_version": "2.4.0",
        "modtrace_version": "frozen", "tags": {"purpose": "frozen"},
        "started_at": "2026-01-01T00:00:00.000000Z",
    }


def make(path: Path) -> None:
    store = open_store(str(path), create=True)
    try:
        # completed, two ranks
        # recorded under a schedule (revision 0007): steps 0 and 1 of the first three
        run_a, _ = create_run(store, "frozen-ddp", {**_meta("torchrun train.py"), "world_size": 2,
                                                    "schedule": "skip_first=0,wait=0,warmup=0,active=2,repeat=1",
                                                    "counters": "first"})
        for rank in (0, 1):
            add_rank(store, run_a, rank, wall_anchor_ns=1_767_225_600_000_000_000 + rank)
            writer = RankWriter(store, run_a, rank)
            events = _events(steps=2)
            # rank 1 ran on a CUDA device with device times (revision 0005's device_events)
            devices = [(0, "cpu")] if rank == 0 else [(0, "cuda:0")]
            writer.write(Batch(events, MODULES, [(0, 1000 + rank, "MainThread")], devices,
                         progress=(len(events), 2), roots=_roots(events),
                         device_rows=_device_rows(events) if rank == 1 else ()))
            # the first step counted (revision 0015's call_counters and counted_ranges)
            calls, ranges = _counters(events)
            write_counters(store, run_a, rank, [(run_a, rank, *c) for c in calls],
                           [(run_a, rank, *r) for r in ranges])
            # the speed probe before each step (revision 0017's step_speeds):
            # (step, seq, ts_ns, probe_ns, cpu_ns, real_ns, threads, work)
            firsts = sorted({e[6]: e for e in reversed(events)}.values(), key=lambda e: e[0])
            write_speeds(store, run_a, rank, [(e[6], e[0], e[1] - 500, 400 + rank, 9000 * i if rank == 0 else None,
                                               10_000 * i if rank == 0 else None, 1, 2) for i, e in enumerate(firsts)])
            finish_rank(store, run_a, rank, "completed", faults={"recorded_steps": "0-1", "step_count": 3})
        # spans and nesting issues of the completed run (revision 0002's tables)
        from modtrace.results.materialize import materialize

        materialize(store, run_a)
        # left running by a process that is gone
        run_b, _ = create_run(store, "frozen-crashed", {**_meta("python train.py"), "step_on": "auto"})
        add_rank(store, run_b, 0, wall_anchor_ns=1_767_225_700_000_000_000)
        events = _events(steps=1)
        RankWriter(store, run_b, 0).write(Batch(events, MODULES, [(0, 2000, "MainThread")], [(0, "cpu")],
                                          progress=(len(events), 1), roots=_roots(events)))
        with store.engine.begin() as conn:
            conn.execute(update(run_ranks).values(hostname="frozen-host", pid=1,
                                                  started_at="2026-01-01T00:00:00.000000Z"))
            conn.execute(update(run_ranks).where(run_ranks.c.ended_at.is_not(None))
                         .values(ended_at="2026-01-01T00:01:05.500000Z"))
            conn.execute(update(runs).where(runs.c.ended_at.is_not(None))
                         .values(ended_at="2026-01-01T00:01:05.500000Z"))
        rev, _ = read_revision(store.engine)
        assert rev == HEAD, rev
    finally:
        store.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=FROZEN_DIR,
                        help="where to write <revision>.db (default: tests/data/frozen)")
    args = parser.parse_args(argv)
    out = args.out_dir / f"{HEAD}.db"
    if out.exists():
        print(f"{out} exists: revision {HEAD} is already frozen (frozen files are never regenerated)",
              file=sys.stderr)
        return 1
    args.out_dir.mkdir(parents=True, exist_ok=True)
    make(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
