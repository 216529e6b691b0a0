#!/usr/bin/env python3
"""Recorder overhead and write-path benchmark (issue: recorder performance).

Side by side in one process, interleaved repeats, medians:

* step time of a 200 x (Linear(16,16) + ReLU) Sequential, batch 4, forward +
  backward, one CPU thread: bare; ``floor``, the least a design of global
  hooks can cost (empty global forward pre/post hooks that each append a
  timestamped tuple, plus one autograd-node pre-hook per call that appends
  one too); ``tracker``, modtrace's hooks alone (``modtrace.tracking.tracker.Tracker``
  appending to a list, emptied at every step, no store: what the hot path
  costs beside the floor); torch.utils.module_tracker.ModuleTracker;
  torch.profiler.profile(CPU, with_stack=True); modtrace.Recorder writing to
  a SQLite file (flushes included: the timed steps end with every event
  written).  Each step ends with ``rec.step()``, as an optimizer step would,
  so modtrace flushes after every step while the next one runs, as in a
  training loop.  ``modtrace`` is the recorder in its steady state (batches
  written by its writer process, started before the clock);
  ``modtrace_thread`` the same with ``writer="thread"`` (batches written by
  a thread of the program), and ``modtrace_no_step`` the recorder in a loop
  with no step boundaries (batches go by size and time; the timed steps end
  with the last batch written), for comparison.  The same runs are also
  given in this process's CPU time (all its threads), which the machine's
  other processes do not change, with the writer process's CPU beside it.
* write path: rows/s through modtrace's store vs raw sqlite3 executemany of
  the same tuples into the same table.
* bytes per event on disk.
* fixed costs: entering a Recorder (imports done), and leaving one after 30
  steps with the default options and with ``analyze=False``; then how long
  the writer process takes to store the analysis after the program left.
* schedule: ``modtrace_schedule_off`` in the overhead table is a Recorder
  whose schedule keeps every timed step off (no module hook installed);
  section ``schedule_off`` measures the same against bare steps, paired.
* gc (deterministic, no clock): for floor, tracker and ModuleTracker, the
  objects Python's garbage collector tracks that one forward leaves alive
  until its backward, per module call, and the collections (all
  generations) that 100 steps bring on.
* split: added time per module call of floor and tracker, forward and
  backward apart (minimum over interleaved single steps, CPU time of this
  process): where the tracker's cost above the floor is.
* hand-over: packing a step's events for the writer process (pickle without
  memo, as now, vs with it, as before), on the tracker's own tuples; freeing
  them at once after packing (now) vs a step later (before); and the writer
  process's write of a step's events with None bound through an adapter (now)
  vs the sqlite3 module's adapter search (before).

Prints a JSON summary on the last line.  Usage: benchmarks/bench_recorder.py [--repeats N] [--steps K]
[--sections overhead,write_path,disk,fixed_costs,handover,schedule_off,gc,split]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's modtrace and benchmarks

import modtrace  # noqa: E402
from benchmarks._common import (  # noqa: E402
    event_rows,
    interleave,
    linear_relu_stack,
    load_average,
    median,
    process_cpu_seconds,
    timed,
)
from modtrace.core.contracts import Batch  # noqa: E402
from modtrace.store.engine import open_store  # noqa: E402
from modtrace.store.runs import add_rank, create_run  # noqa: E402
from modtrace.store.writer import EVENT_COLUMNS, RankWriter  # noqa: E402
from modtrace.tracking.tracker import Tracker  # noqa: E402

BLOCKS = 200


def run_steps(model: nn.Module, x: torch.Tensor, steps: int, on_step: Any = None) -> None:
    for _ in range(steps):
        model(x).sum().backward()
        model.zero_grad(set_to_none=True)
        if on_step is not None:
            on_step()


class Floor:
    """The floor of a hook design: global forward pre/post hooks and one
    autograd-node pre-hook per call, each appending a timestamped tuple and
    doing nothing else."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self._handles: list[Any] = []

    def __enter__(self) -> Floor:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        rows, clock = self.rows, time.perf_counter_ns
        append = rows.append

        def on_grad(*_: Any) -> None:
            append((clock(), 1))

        def pre(module: nn.Module, args: Any) -> None:
            append((clock(), 0, id(module)))

        def post(module: nn.Module, args: Any, out: Any) -> None:
            append((clock(), 1, id(module)))
            fn = getattr(out, "grad_fn", None)
            if fn is not None:
                fn.register_prehook(on_grad)

        self._handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self.rows.clear()


class TrackerAlone:
    """modtrace's hooks with a list for a sink, emptied at every step (as the
    recorder hands its buffer on): the tracker's cost without the store."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self._tracker = Tracker(self.rows.append)

    def __enter__(self) -> TrackerAlone:
        self._tracker.start()
        return self

    def step(self) -> None:
        self._tracker.step += 1
        self.rows.clear()

    def __exit__(self, *exc: Any) -> None:
        self._tracker.stop()
        self.rows.clear()


def time_config(name: str, model: nn.Module, x: torch.Tensor, steps: int, tmp: Path, rep: int,
                writer_cpu: list[float] | None = None, program_cpu: list[float] | None = None,
                final_flush: list[float] | None = None) -> float:
    """Seconds per step inside an already-open context, plus the cost of
    getting the data out (``program_cpu`` gets this process's CPU seconds per
    step, all its threads, over the same span).

    Opening a context is a one-time cost of a run and is left out for every
    tool.  Getting the data out is not: modtrace's time ends after every event
    is written to the database (a synchronous flush), the profiler's after it
    stops and processes what it collected (leaving the context).
    """
    if name == "bare":
        ctx: Any = nullcontext()
    elif name == "floor":
        ctx = Floor()
    elif name == "tracker":
        ctx = TrackerAlone()
    elif name == "module_tracker":
        from torch.utils.module_tracker import ModuleTracker

        ctx = ModuleTracker()
    elif name == "profiler_with_stack":
        from torch.profiler import ProfilerActivity, profile

        ctx = profile(activities=[ProfilerActivity.CPU], with_stack=True)
    elif name in ("modtrace", "modtrace_thread", "modtrace_no_step", "modtrace_schedule_off"):
        writer = "thread" if name in ("modtrace_thread", "modtrace_schedule_off") else "process"
        # schedule_off: every timed step is outside the schedule's recorded steps (no module hook);
        # nothing is written, so no writer process (its start would overlap the timed steps)
        sched = modtrace.schedule(skip_first=10**9, active=1) if name == "modtrace_schedule_off" else None
        ctx = modtrace.Recorder(db=str(tmp / "bench.db"), run=f"bench-{name}-{rep}", analyze=False, writer=writer,
                                schedule=sched)
    else:
        raise ValueError(name)
    ctx.__enter__()
    try:
        on_step = ctx.step if name in ("modtrace", "modtrace_thread", "modtrace_schedule_off", "tracker") else None
        run_steps(model, x, 1, on_step)  # a first step inside the context, outside the clock
        pid = None
        if name.startswith("modtrace"):
            ctx.flush()  # and its first batch: the writer process is running from here on
            pid = ctx.writer_pid
        cpu0 = process_cpu_seconds(pid)
        own0 = time.process_time()
        t0 = time.perf_counter()
        run_steps(model, x, steps, on_step)
        if name.startswith("modtrace"):
            t1 = time.perf_counter()
            ctx.flush()
            if final_flush is not None:
                final_flush.append(time.perf_counter() - t1)
            cpu1 = process_cpu_seconds(pid)
            if writer_cpu is not None and cpu0 is not None and cpu1 is not None:
                writer_cpu.append(cpu1 - cpu0)
        elif name == "profiler_with_stack":
            ctx.__exit__(None, None, None)
            ctx = None
        elapsed = time.perf_counter() - t0
        if program_cpu is not None:
            program_cpu.append((time.process_time() - own0) / steps)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return elapsed / steps


def overhead(repeats: int, steps: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = linear_relu_stack(BLOCKS)
    x = torch.randn(4, 16)
    configs = ["bare", "floor", "tracker", "module_tracker", "profiler_with_stack", "modtrace", "modtrace_thread",
               "modtrace_no_step", "modtrace_schedule_off"]
    writer_cpu: list[float] = []
    final_flush: list[float] = []
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    reps = dict.fromkeys(configs, 0)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for c in configs:  # warm-up
            time_config(c, model, x, 2, tmp, -1 - configs.index(c))

        def config(c: str) -> float:  # seconds per step, timed inside (the context's opening left out)
            reps[c] += 1
            return time_config(c, model, x, steps, tmp, reps[c], writer_cpu if c == "modtrace" else None,
                               cpu[c], final_flush if c == "modtrace" else None)

        samples = interleave({c: partial(config, c) for c in configs}, repeats, rng=random.Random(0),
                             own_time=configs)
    med = samples.medians()
    calls = 1 + 2 * BLOCKS  # module calls per step (each has a forward and a backward)
    added = {c: (med[c] - med["bare"]) / calls for c in configs if c != "bare"}
    cpu_med = {c: median(v) for c, v in cpu.items()}
    added_cpu = {c: (cpu_med[c] - cpu_med["bare"]) / calls for c in configs if c != "bare"}
    writer_per_call = sum(writer_cpu) / (len(writer_cpu) * steps * calls) if writer_cpu else None
    return {
        "step_ms_median": {c: round(v * 1e3, 3) for c, v in med.items()},
        "added_us_per_module_call": {c: round(v * 1e6, 2) for c, v in added.items()},
        "modtrace_vs_module_tracker_added_ratio": round(added["modtrace"] / added["module_tracker"], 3),
        "modtrace_vs_floor_added_ratio": round(added["modtrace"] / added["floor"], 3),
        "module_tracker_vs_floor_added_ratio": round(added["module_tracker"] / added["floor"], 3),
        "tracker_vs_floor_added_ratio": round(added["tracker"] / added["floor"], 3),
        "modtrace_vs_profiler_step_ratio": round(med["modtrace"] / med["profiler_with_stack"], 3),
        "modtrace_thread_vs_module_tracker_added_ratio": round(added["modtrace_thread"] / added["module_tracker"], 3),
        "modtrace_no_step_vs_module_tracker_added_ratio": round(added["modtrace_no_step"] / added["module_tracker"], 3),
        # a schedule's off steps: no module hook installed; the goal is <= 0.5 us per module call
        "schedule_off_added_us_per_module_call": round(added["modtrace_schedule_off"] * 1e6, 3),
        # CPU the writer process spent per module call (on another core), beside the step's own time
        # (summed over every repeat: the kernel counts CPU time in 10 ms ticks)
        "writer_process_cpu_us_per_module_call": round(writer_per_call * 1e6, 2) if writer_per_call is not None else None,
        # of modtrace's added time: the wait at the end of each repeat for the writer process to
        # commit the last step's batch (handed over at its rec.step()), spread over the repeat's calls
        "modtrace_final_flush_us_per_module_call": round(median(final_flush) / (steps * calls) * 1e6, 2),
        # The same configurations in CPU time rather than wall time: this process's CPU (all its
        # threads; a thread writer's writing included) per module call, which time the machine's
        # other processes take from the program does not change.  ``modtrace`` plus its writer
        # process's CPU is everything the recording costs, wherever it runs.
        "added_program_cpu_us_per_module_call": {c: round(v * 1e6, 2) for c, v in added_cpu.items()},
        "modtrace_vs_floor_program_cpu_ratio": round(added_cpu["modtrace"] / added_cpu["floor"], 3),
        "tracker_vs_floor_program_cpu_ratio": round(added_cpu["tracker"] / added_cpu["floor"], 3),
        "modtrace_thread_vs_floor_program_cpu_ratio": round(added_cpu["modtrace_thread"] / added_cpu["floor"], 3),
        "modtrace_with_writer_vs_floor_cpu_ratio": round((added_cpu["modtrace"] + writer_per_call) / added_cpu["floor"], 3)
        if writer_per_call is not None else None,
        "load_average": load_average(),
        "module_calls_per_step": calls,
        "repeats": repeats,
        "steps_per_repeat": steps,
    }


def write_path(n: int, repeats: int) -> dict[str, Any]:
    rows = event_rows(n)
    cols = ", ".join(EVENT_COLUMNS)
    marks = ", ".join("?" for _ in EVENT_COLUMNS)
    made = [0]

    def new_run(d: str, which: str) -> tuple[Path, Any, int]:
        made[0] += 1
        path = Path(d) / f"{which}-{made[0]}.db"
        store = open_store(str(path), create=True)
        run_id, _ = create_run(store, f"w{made[0]}", {})
        add_rank(store, run_id, 0, 0)
        return path, store, run_id

    def ours(d: str) -> float:
        _, store, run_id = new_run(d, "ours")
        writer = RankWriter(store, run_id, 0)

        def write() -> None:
            for i in range(0, n, 20_000):
                writer.write(Batch(rows[i:i + 20_000]))

        seconds = timed(write)[0]
        store.dispose()
        return seconds

    def raw(d: str) -> float:
        path, store, run_id = new_run(d, "raw")
        store.dispose()
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        sql = f"INSERT INTO events (run_id, rank, {cols}) VALUES ({run_id}, 0, {marks})"

        def write() -> None:
            for i in range(0, n, 20_000):
                with conn:
                    conn.executemany(sql, rows[i:i + 20_000])

        seconds = timed(write)[0]
        conn.close()
        return seconds

    with tempfile.TemporaryDirectory() as d:
        samples = interleave({"ours": lambda: ours(d), "raw": lambda: raw(d)}, repeats, own_time=("ours", "raw"))
    o, r = (median(n / s for s in samples.wall[k]) for k in ("ours", "raw"))
    return {"rows_per_s_modtrace": round(o), "rows_per_s_raw_sqlite3": round(r), "ratio": round(o / r, 3), "rows": n}


def bytes_per_event(steps: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    model = linear_relu_stack(BLOCKS)
    x = torch.randn(4, 16)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "size.db"
        empty = Path(d) / "empty.db"
        open_store(str(empty), create=True).dispose()
        with modtrace.Recorder(db=str(path), run="size", analyze=False) as rec:
            run_steps(model, x, steps)
        events = rec.events_recorded
        for p in (path, empty):
            conn = sqlite3.connect(p)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("VACUUM")
            conn.close()
        conn = sqlite3.connect(path)
        try:
            events_bytes = conn.execute("SELECT SUM(pgsize) FROM dbstat WHERE name = 'events'").fetchone()[0]
        except sqlite3.OperationalError:
            events_bytes = None
        conn.close()
        size = os.path.getsize(path) - os.path.getsize(empty)
    return {
        "events": events,
        "file_bytes_per_event": round(size / events, 2),
        "events_table_bytes_per_event": round(events_bytes / events, 2) if events_bytes else None,
    }


def fixed_costs(repeats: int, steps: int = 30) -> dict[str, Any]:
    """Entering a Recorder, and leaving it after ``steps`` steps (default
    options, and without the end-of-recording analysis), medians."""
    torch.set_num_threads(1)
    model = linear_relu_stack(BLOCKS)
    x = torch.randn(4, 16)
    enter: list[float] = []
    analysis_wait: list[float] = []
    events = [0]
    made = [0]

    def leave_after_steps(d: str, which: str) -> float:
        """Seconds to leave a Recorder after ``steps`` steps; its entering and the analysis
        after it are timed on the side."""
        made[0] += 1
        kwargs: dict[str, Any] = {} if which == "default" else {"analyze": False}
        rec = modtrace.Recorder(db=str(Path(d) / f"fixed-{made[0]}-{which}.db"), run="fixed", **kwargs)
        enter.append(timed(rec.__enter__)[0])
        try:
            run_steps(model, x, steps, rec.step)
        finally:
            seconds = timed(lambda: rec.__exit__(None, None, None))[0]
            # the writer process analyses after the program's context
            waited = timed(rec.wait_analyzed)[0]
            if which == "default":
                analysis_wait.append(waited)
        events[0] = rec.events_recorded
        return seconds

    with tempfile.TemporaryDirectory() as d:
        leave = interleave({w: partial(leave_after_steps, d, w) for w in ("default", "analyze_false")}, repeats,
                           own_time=("default", "analyze_false")).medians()
        create = new_database_costs(Path(d), repeats)
    return {
        "enter_ms_median": round(median(enter) * 1e3, 2),
        # a new database: created at head from the metadata in one transaction (now) vs Alembic's
        # upgrade through every revision (before)
        "new_db_ms_median": create,
        "new_db_fast_vs_alembic_ratio": round(create["fast"] / create["alembic"], 3),
        "leave_ms_median": {k: round(v * 1e3, 2) for k, v in leave.items()},
        # after leaving with the default options: until the writer process has stored the analysis
        # (what `modtrace record` waits for; the program does not)
        "analysis_after_leave_ms_median": round(median(analysis_wait) * 1e3, 2),
        "steps": steps,
        "events": events[0],
        "repeats": repeats,
    }


def new_database_costs(d: Path, repeats: int) -> dict[str, float]:
    import sqlalchemy as sa

    from modtrace.store.base import Store
    from modtrace.store.migrate import upgrade

    made = [0]

    def path(which: str) -> Path:
        made[0] += 1
        return d / f"new-{which}-{made[0]}.db"

    def fast() -> None:
        open_store(str(path("fast")), create=True).dispose()

    def alembic() -> None:
        where = path("alembic")
        engine = sa.create_engine(f"sqlite:///{where}", poolclass=sa.pool.NullPool)
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode = WAL")
        upgrade(Store(engine=engine, label=str(where), path=where))
        engine.dispose()

    times = interleave({"fast": fast, "alembic": alembic}, repeats * 2).medians()
    return {k: round(v * 1e3, 2) for k, v in times.items()}


def schedule_off(repeats: int, steps: int) -> dict[str, Any]:
    """A schedule's off steps vs no recording at all, paired: each repeat times ``steps`` bare
    steps and ``steps`` off steps (no module hook installed, ``rec.step()`` at each) back to back,
    in alternating order; the median of the per-repeat differences, per module call."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = linear_relu_stack(BLOCKS)
    x = torch.randn(4, 16)
    calls = 1 + 2 * BLOCKS
    with tempfile.TemporaryDirectory() as d:
        rec = modtrace.Recorder(db=str(Path(d) / "off.db"), run="off", analyze=False, writer="thread",
                                schedule=modtrace.schedule(skip_first=10**9, active=1))
        with rec:
            run_steps(model, x, 2, rec.step)
            pairs = interleave({"bare": lambda: run_steps(model, x, steps), "off": lambda: run_steps(model, x, steps, rec.step)},
                               repeats * 6)
            diffs = [v / steps for v in pairs.paired_differences("off", "bare")]
            cpu_diffs = [v / steps for v in pairs.paired_differences("off", "bare", cpu=True)]
            # What an off step adds, taken apart: the module hooks installed (none), and the
            # step boundary itself (rec.step(), once a step), spread over the step's calls.
            import torch.nn.modules.module as module_hooks

            hooks = len(module_hooks._global_forward_pre_hooks) + len(module_hooks._global_forward_hooks)
            n = 20_000

            def boundaries() -> None:
                for _ in range(n):
                    rec.step()

            step_s = timed(boundaries)[0] / n
        assert rec.events_recorded == 0
    return {"added_us_per_module_call_median": round(median(diffs) / calls * 1e6, 3),
            # the same pairs in this process's CPU time (what other processes on the machine do not move)
            "added_cpu_us_per_module_call_median": round(median(cpu_diffs) / calls * 1e6, 3),
            "module_hooks_installed_in_off_steps": hooks,
            "step_boundary_us": round(step_s * 1e6, 3),
            "step_boundary_us_per_module_call": round(step_s / calls * 1e6, 4),
            "paired_repeats": len(diffs), "steps_per_repeat": steps, "goal_us": 0.5}


def handover(repeats: int) -> dict[str, Any]:
    """Packing one step's events for the writer process, as the program does between steps:
    today's pickle without memo vs the pickle with memo it replaced, on the tracker's own tuples."""
    import pickle

    from modtrace.recording.writer_messages import pack_batch

    torch.set_num_threads(1)
    model = linear_relu_stack(BLOCKS)
    x = torch.randn(4, 16)
    events: list[tuple[Any, ...]] = []
    tracker = Tracker(events.append)
    tracker.start()
    try:
        run_steps(model, x, 1)
    finally:
        tracker.stop()
    batch: list[tuple[Any, ...]] = []

    def fresh(_: str) -> None:
        batch[:] = [tuple(e) for e in events]  # fresh tuples, as each step's are

    packs = interleave({
        "old": lambda: pickle.dumps(("write", list(batch), [], [], [], (0, 0), []), protocol=pickle.HIGHEST_PROTOCOL),
        "new": lambda: pack_batch(Batch(batch, progress=(0, 0))),
    }, repeats * 20, before=fresh).medians()
    o, n = packs["old"], packs["new"]
    calls = 1 + 2 * BLOCKS
    return {
        "events_per_step": len(events),
        "pack_us_per_event": {"pickle_memo_before": round(o / len(events) * 1e6, 3),
                              "pickle_no_memo_now": round(n / len(events) * 1e6, 3)},
        "pack_us_per_module_call_now": round(n / calls * 1e6, 3),
        "now_vs_before_ratio": round(n / o, 3),
        "free_cpu_us_per_step": freeing_packed_events(model, x, repeats),
        "writer_write_cpu_us_per_event": writer_binding(events, repeats),
    }


def freeing_packed_events(model: nn.Module, x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Freeing a step's event tuples (this thread's CPU time): at once after packing them, as a
    packed batch does now, vs a step later, when the writer's answer came (before)."""
    from modtrace.recording.writer_messages import pack_batch

    rows: list[tuple[Any, ...]] = []
    tracker = Tracker(rows.append)
    times: dict[str, list[int]] = {"at_pack_now": [], "next_step_before": []}
    clock = time.thread_time_ns
    tracker.start()
    try:
        run_steps(model, x, 2)
        for rep in range(repeats * 20):
            run_steps(model, x, 1)
            batch = rows[:]
            del rows[:]
            pack_batch(Batch(batch, progress=(0, 0)))
            if rep % 2 == 0:
                t0 = clock()
                del batch
                times["at_pack_now"].append(clock() - t0)
            else:
                run_steps(model, x, 1)  # the next step runs while the batch waits for its answer
                del rows[:]
                t0 = clock()
                del batch
                times["next_step_before"].append(clock() - t0)
    finally:
        tracker.stop()
    return {k: round(median(v) / 1e3, 1) for k, v in times.items()}


def writer_binding(events: list[tuple[Any, ...]], repeats: int) -> dict[str, float]:
    """RankWriter.write of one step's events into a SQLite file (this thread's CPU time, which is
    what the writer process takes from the machine), as the writer process runs it now
    (None bound through a registered adapter, modtrace.recording.writer_child) vs before (the
    sqlite3 module's adapter search for every None), interleaved; per event."""
    import sqlite3

    key = (type(None), sqlite3.PrepareProtocol)
    saved = sqlite3.adapters.get(key)
    with tempfile.TemporaryDirectory() as d:
        store = open_store(str(Path(d) / "bind.db"), create=True)
        run_id, _ = create_run(store, "bind", {})
        add_rank(store, run_id, 0, 0)
        writer = RankWriter(store, run_id, 0)
        seq = [0]
        batch: list[tuple[Any, ...]] = []

        def prepare(which: str) -> None:
            if which == "none_adapter_now":
                sqlite3.adapters[key] = {}.get
            else:
                sqlite3.adapters.pop(key, None)
            batch[:] = [(seq[0] + i, *e[1:]) for i, e in enumerate(events)]
            seq[0] += len(batch)

        def write() -> None:
            writer.write(Batch(batch, progress=(seq[0], seq[0] // len(events))))

        try:
            times = interleave({"none_adapter_now": write, "plain_before": write}, repeats * 20, clock=time.thread_time,
                               before=prepare).wall
        finally:
            if saved is None:
                sqlite3.adapters.pop(key, None)
            else:
                sqlite3.adapters[key] = saved
            writer.close()
            store.dispose()
    med = {k: median(v) / len(events) * 1e6 for k, v in times.items()}
    return {**{k: round(v, 3) for k, v in med.items()},
            "now_vs_before_ratio": round(med["none_adapter_now"] / med["plain_before"], 3)}


def gc_costs(steps: int = 100) -> dict[str, Any]:
    """Deterministic: GC-tracked objects a forward leaves alive until its
    backward, per module call, and GC collections per 100 steps (no clock)."""
    from torch.utils.module_tracker import ModuleTracker

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = linear_relu_stack(BLOCKS)
    x = torch.randn(4, 16)
    calls = 1 + 2 * BLOCKS
    out: dict[str, Any] = {}
    for name in ("bare", "floor", "tracker", "module_tracker"):
        ctx: Any = {"bare": nullcontext, "floor": Floor, "tracker": TrackerAlone, "module_tracker": ModuleTracker}[name]()
        on_step = ctx.step if name == "tracker" else None
        ctx.__enter__()
        try:
            run_steps(model, x, 2, on_step)
            gc.collect()
            gc.disable()
            try:
                n0 = len(gc.get_objects())
                loss = model(x).sum()
                n1 = len(gc.get_objects())
                loss.backward()
                del loss
                model.zero_grad(set_to_none=True)
                if on_step is not None:
                    on_step()
            finally:
                gc.enable()
            gc.collect()
            c0 = sum(s["collections"] for s in gc.get_stats())
            run_steps(model, x, steps, on_step)
            c1 = sum(s["collections"] for s in gc.get_stats())
        finally:
            ctx.__exit__(None, None, None)
        out[name] = {"tracked_objects_per_call": round((n1 - n0) / calls, 2),
                     "gc_collections_per_100_steps": round((c1 - c0) * 100 / steps, 1)}
    return out


def forward_backward_split(repeats: int) -> dict[str, Any]:
    """Added CPU microseconds per module call in forward and in backward, for
    floor and tracker (minimum over interleaved single steps)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = linear_relu_stack(BLOCKS)
    x = torch.randn(4, 16)
    calls = 1 + 2 * BLOCKS
    names = ["bare", "floor", "tracker"]
    fwd: dict[str, list[float]] = {n: [] for n in names}
    bwd: dict[str, list[float]] = {n: [] for n in names}
    rng = random.Random(0)
    for _ in range(repeats):
        for name in rng.sample(names, len(names)):
            ctx: Any = {"bare": nullcontext, "floor": Floor, "tracker": TrackerAlone}[name]()
            ctx.__enter__()
            try:
                run_steps(model, x, 1)
                t0 = time.process_time()
                loss = model(x).sum()
                t1 = time.process_time()
                loss.backward()
                t2 = time.process_time()
                model.zero_grad(set_to_none=True)
            finally:
                ctx.__exit__(None, None, None)
            fwd[name].append(t1 - t0)
            bwd[name].append(t2 - t1)
    out: dict[str, Any] = {}
    for name in ("floor", "tracker"):
        out[name] = {"forward_added_us_per_call": round((min(fwd[name]) - min(fwd["bare"])) / calls * 1e6, 2),
                     "backward_added_us_per_call": round((min(bwd[name]) - min(bwd["bare"])) / calls * 1e6, 2)}
    return out


SECTIONS = ("overhead", "write_path", "disk", "fixed_costs", "handover", "schedule_off", "gc", "split")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--write-rows", type=int, default=400_000)
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help="comma-separated sections to measure (default: all)")
    args = ap.parse_args()
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s): {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")
    runs = {
        "overhead": lambda: overhead(args.repeats, args.steps),
        "write_path": lambda: write_path(args.write_rows, max(3, args.repeats // 2)),
        "disk": lambda: bytes_per_event(50),
        "fixed_costs": lambda: fixed_costs(max(3, args.repeats // 2)),
        "handover": lambda: handover(args.repeats),
        "schedule_off": lambda: schedule_off(args.repeats, args.steps),
        "gc": lambda: gc_costs(),
        "split": lambda: forward_backward_split(max(15, args.repeats * 3)),
    }
    summary: dict[str, Any] = {section: runs[section]() for section in SECTIONS if section in chosen}
    summary["torch"] = torch.__version__
    for section, values in summary.items():
        print(f"{section}: {values}", file=sys.stderr)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
