"""Benchmark: events -> spans + nesting issues, polars rebuild vs a plain Python stack loop.

Generates events of a realistic shape (a ~600-module model, 12 blocks of 50
modules, forward and backward every step, backward hook dispatches tied as
autograd fires them, roots closed at the end of backward), then times, in
one process, in rounds (each round runs every size through both paths, so a
change of the machine's load falls on all of them; medians over rounds):

- ``polars``: modtrace.analysis.analyze_events (normalise, rebuild, check);
- ``python``: a straightforward pure-Python loop doing the same work over the
  same rows, given as a list of tuples (tie normalisation, one stack per
  thread and graph task, self time, unclosed/no_enter/crossed and status
  issues).

Both paths must agree on the number of spans and issues and on the total
self time.  Peak RSS of the polars path is measured in a fresh child
process per size that reads the events from a parquet file the parent
wrote (so generation is not counted; the input frame is).  Reading the
rows back from SQLite through modtrace.store.reader is timed separately.
Reports the polars thread pool size (set POLARS_MAX_THREADS to choose it)
and the load average around each measurement.  Prints one JSON summary.

    python scripts/bench_analysis.py [--sizes 1000000,10000000] [--repeats 5]
        [--python-repeats 3] [--read-sizes 1000000] [--read-repeats 3] [--skip-read]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import polars as pl

BLOCKS, GROUPS, LEAVES = 12, 7, 6  # 1 + 12 * (1 + 7 * (1 + 6)) + 1 = 602 modules


def build_model() -> tuple[pl.DataFrame, list[tuple[int, list[int]]]]:
    """Modules frame, and the call tree as (module, children) for each module."""
    rows: list[tuple[int, str, str, int | None]] = [(0, "Net", "Net", None)]
    children: dict[int, list[int]] = {0: []}

    def add(fqn: str, kind: str, parent: int) -> int:
        mid = len(rows)
        rows.append((mid, fqn, kind, parent))
        children[mid] = []
        children[parent].append(mid)
        return mid

    for b in range(BLOCKS):
        blk = add(f"Net.blocks.{b}", "Block", 0)
        for g in range(GROUPS):
            grp = add(f"Net.blocks.{b}.g{g}", "Group", blk)
            for leaf in range(LEAVES):
                add(f"Net.blocks.{b}.g{g}.fc{leaf}", "Linear", grp)
    add("Net.head", "Linear", 0)
    mods = pl.DataFrame(
        [(0, *r) for r in rows],
        schema={"rank": pl.Int32, "module_id": pl.Int32, "fqn": pl.String, "module_type": pl.String,
                "parent_module_id": pl.Int32},
        orient="row",
    )
    return mods, list(children.items())


def step_template(children: dict[int, list[int]]) -> list[tuple[int, int, int, int, int]]:
    """One step's events as (kind, module, phase, tie, status); call id = module id."""
    out: list[tuple[int, int, int, int, int]] = []

    def fwd(m: int) -> None:
        out.append((0, m, 0, 0, 0))
        for c in children[m]:
            fwd(c)
        out.append((1, m, 0, 0, 0))

    fwd(0)
    bwd: list[tuple[int, int, int, int, int]] = []

    def back(m: int) -> None:
        bwd.append((0, m, 1, 0, 0))
        for c in reversed(children[m]):
            back(c)
        bwd.append((1, m, 1, 0, 0))

    back(0)
    # The root and the first block's first group close at the end of the graph
    # task (their inputs need no grad): move their exits to the end, innermost first.
    late = [0, 1, 2]
    moved = [e for e in bwd if e[0] == 1 and e[1] in late]
    bwd = [e for e in bwd if not (e[0] == 1 and e[1] in late)]
    bwd += [(1, m, 1, 0, 3) for m in (2, 1, 0)]
    assert len(moved) == 3
    # Hook dispatches: an enter followed by its child's enter fires child first;
    # a child's exit followed by its parent's exit fires parent first.
    i = 0
    while i + 1 < len(bwd):
        a, b = bwd[i], bwd[i + 1]
        if a[0] == 0 and b[0] == 0 and a[4] == 0:
            bwd[i], bwd[i + 1] = (b[0], b[1], 1, 0, b[4]), (a[0], a[1], 1, 1, a[4])
            i += 2
        elif a[0] == 1 and b[0] == 1 and a[4] == 0 and b[4] == 0:
            bwd[i], bwd[i + 1] = (b[0], b[1], 1, 0, b[4]), (a[0], a[1], 1, 1, a[4])
            i += 2
        else:
            i += 1
    return out + bwd


def generate(n_events: int, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    mods, tree = build_model()
    template = np.array(step_template(dict(tree)), dtype=np.int64)
    per_step = len(template)
    steps = max(1, n_events // per_step)
    n = steps * per_step
    rng = np.random.default_rng(seed)
    tiled = np.tile(template, (steps, 1))
    step = np.repeat(np.arange(steps, dtype=np.int32), per_step)
    n_modules = mods.height
    call = step.astype(np.int64) * n_modules + tiled[:, 1]
    ts = np.cumsum(rng.integers(1, 2000, n, dtype=np.int64))
    phase = tiled[:, 2].astype(np.int8)
    events = pl.DataFrame({
        "run_id": np.ones(n, dtype=np.int32),
        "rank": np.zeros(n, dtype=np.int32),
        "seq": np.arange(n, dtype=np.int64),
        "ts_ns": ts,
        "kind": tiled[:, 0].astype(np.int8),
        "module_id": tiled[:, 1].astype(np.int32),
        "phase": phase,
        "call_id": call,
        "step": step,
        "thread_id": np.zeros(n, dtype=np.int32),
        "device_id": np.zeros(n, dtype=np.int32),
        "stream": pl.Series([None] * 0, dtype=pl.Int64).extend_constant(None, n),
        "status": tiled[:, 4].astype(np.int8),
        "graph_task": pl.Series(np.where(phase == 1, step.astype(np.int64) + 1, 0)).set(
            pl.Series(phase == 0), None),  # type: ignore[arg-type]
        "tie": tiled[:, 3].astype(np.int8),
    })
    devices = pl.DataFrame({"rank": [0], "device_id": [0], "name": ["cpu"]})
    return events, mods, devices


# ----------------------------------------------------------- plain Python path


def python_analysis(rows: list[tuple[Any, ...]], depth_of: dict[int, int]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Spans and issues with a plain loop. Row: (seq, ts, kind, module, phase, call, step, thread, status, gt, tie)."""
    # 1. tie normalisation, per thread, in seq order
    opened: dict[tuple[int, int], int] = {}
    counter = 0
    pending: dict[int, list[tuple[Any, ...]]] = {}
    ordered: list[tuple[int, tuple[Any, ...]]] = []

    def flush(group: list[tuple[Any, ...]]) -> None:
        nonlocal counter
        if len(group) == 1:
            r = group[0]
            if r[2] == 0:
                counter += 1
                opened[(r[5], r[4])] = counter
            ordered.append((r[0], r))
            return
        exits = sorted((r for r in group if r[2] == 1), key=lambda r: -opened.get((r[5], r[4]), -1))
        enters = sorted((r for r in group if r[2] == 0), key=lambda r: (depth_of.get(r[3], 0), r[0]))
        for r in enters:
            counter += 1
            opened[(r[5], r[4])] = counter
        for slot, r in zip(sorted(r[0] for r in group), exits + enters, strict=True):
            ordered.append((slot, r))

    for r in rows:
        thread = r[7]
        if r[10] == 1 and thread in pending:
            pending[thread].append(r)
            continue
        if thread in pending:
            flush(pending.pop(thread))
        pending[thread] = [r]
    for group in pending.values():
        flush(group)
    ordered.sort(key=lambda x: x[0])
    # 2. stacks
    stacks: dict[tuple[int, Any], list[list[Any]]] = {}
    spans: list[list[Any]] = []
    issues: list[tuple[Any, ...]] = []
    for _, r in ordered:
        seq, ts, kind, module, phase, call, step, thread, status, gt, _tie = r
        stack = stacks.setdefault((thread, None if phase == 0 else gt), [])
        if kind == 0:
            parent = stack[-1][0][0] if stack else None
            span = [seq, parent, len(stack), module, phase, call, step, ts, None, None]
            stack.append([span, call, phase])
            spans.append(span)
        else:
            if stack and stack[-1][1] == call and stack[-1][2] == phase:
                span = stack.pop()[0]
                span[8], span[9] = ts, status
                if status in (1, 2, 3):
                    issues.append((seq, ("error_exit", "early_stop", "closed_at_end_of_backward")[status - 1], module))
            elif any(e[1] == call and e[2] == phase for e in stack):
                issues.append((seq, "crossed", module))
                while stack and not (stack[-1][1] == call and stack[-1][2] == phase):
                    stack.pop()
                span = stack.pop()[0]
                span[8], span[9] = ts, status
            else:
                issues.append((seq, "no_enter", module))
    for stack in stacks.values():
        for span, _, _ in stack:
            issues.append((span[0], "unclosed", span[3]))
    # 3. self time
    index = {s[0]: s for s in spans}
    child_ns: dict[int, int] = {}
    for s in spans:
        if s[1] is not None and s[8] is not None:
            child_ns[s[1]] = child_ns.get(s[1], 0) + s[8] - s[7]
    out = []
    for s in spans:
        dur = None if s[8] is None else s[8] - s[7]
        out.append((*s, dur, None if dur is None else dur - child_ns.get(s[0], 0)))
    del index
    return out, issues


# ------------------------------------------------------------------ measuring


def rss_mb(field: str = "VmHWM") -> float:
    """This process image's peak (VmHWM) or current (VmRSS) resident set in MiB.

    VmHWM, not ru_maxrss: after fork+exec Linux carries the parent's
    high-water mark into the child's ru_maxrss, which would count the
    parent's rows here.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def child_polars(events_path: str) -> None:
    """Fresh process: read the events (parquet), analyse once, report time and memory."""
    from modtrace.analysis import analyze_events

    events = pl.read_parquet(events_path).rechunk()  # one buffer per column, as modtrace.store.reader returns
    mods = pl.read_parquet(events_path + ".modules")
    devs = pl.DataFrame({"rank": [0], "device_id": [0], "name": ["cpu"]})
    gc.collect()
    before = rss_mb("VmRSS")
    t0 = time.perf_counter()
    result = analyze_events(events, mods, devs)
    elapsed = time.perf_counter() - t0
    print(json.dumps({"events": events.height, "spans": result.spans.height, "issues": result.issues.height,
                      "seconds": elapsed, "peak_rss_mb": rss_mb(), "rss_with_input_mb": before,
                      "input_frame_mb": events.estimated_size() / 2**20, "polars_threads": pl.thread_pool_size()}))


def measure_sizes(sizes: list[int], repeats: int, python_repeats: int, tmp: str) -> list[dict[str, Any]]:
    """Time every size in every round (polars, then the Python loop, size after size), so that a change in
    the machine's load between rounds falls on all sizes and both paths alike."""
    from modtrace.analysis import analyze_events
    from modtrace.analysis.events import module_depths

    data = []
    for n in sizes:
        events, mods, devs = generate(n)
        events_path = os.path.join(tmp, f"events_{n}.parquet")
        events.write_parquet(events_path)
        mods.write_parquet(events_path + ".modules")
        depth_of = {m: d for _, m, d in module_depths(mods).iter_rows()}
        rows = events.select("seq", "ts_ns", "kind", "module_id", "phase", "call_id", "step", "thread_id", "status",
                             "graph_task", "tie").rows()
        data.append((events, mods, devs, depth_of, rows, events_path))
    polars_s: list[list[float]] = [[] for _ in sizes]
    python_s: list[list[float]] = [[] for _ in sizes]
    checks: list[dict[str, int]] = [{} for _ in sizes]
    loads: list[list[float]] = [load_average()]
    for i in range(max(repeats, python_repeats)):
        for k, (events, mods, devs, depth_of, rows, _) in enumerate(data):
            check = checks[k]
            if i < repeats:
                gc.collect()
                t0 = time.perf_counter()
                result = analyze_events(events, mods, devs)
                polars_s[k].append(time.perf_counter() - t0)
                check["polars_spans"], check["polars_issues"] = result.spans.height, result.issues.height
                check["polars_self_ns"] = int(result.spans["self_ns"].sum())
                del result
            if i < python_repeats:
                gc.collect()
                t0 = time.perf_counter()
                spans, issues = python_analysis(rows, depth_of)
                python_s[k].append(time.perf_counter() - t0)
                check["python_spans"], check["python_issues"] = len(spans), len(issues)
                check["python_self_ns"] = sum(s[-1] for s in spans if s[-1] is not None)
                del spans, issues
        loads.append(load_average())
    results = []
    for k in range(len(sizes)):
        check = checks[k]
        # Both paths must have done the same work.
        assert check["polars_spans"] == check["python_spans"], check
        assert check["polars_issues"] == check["python_issues"], check
        assert check["polars_self_ns"] == check["python_self_ns"], check
        events_path = data[k][5]
        height = data[k][0].height
        data[k] = None  # type: ignore[call-overload]
        gc.collect()
        child = subprocess.run([sys.executable, __file__, "--child", events_path], capture_output=True, text=True,
                               check=True)
        peak = json.loads(child.stdout.strip().splitlines()[-1])
        results.append({
            "events": height,
            "spans": check["polars_spans"],
            "issues": check["polars_issues"],
            "polars_median_s": statistics.median(polars_s[k]),
            "polars_runs_s": polars_s[k],
            "python_median_s": statistics.median(python_s[k]),
            "python_runs_s": python_s[k],
            "speedup": statistics.median(python_s[k]) / statistics.median(polars_s[k]),
            "child": {
                "seconds": peak["seconds"],
                "peak_rss_mb": peak["peak_rss_mb"],
                "rss_with_input_mb": peak["rss_with_input_mb"],
                "input_frame_mb": peak["input_frame_mb"],
            },
        })
    for r in results:
        r["load_average_per_round"] = loads
    return results


def measure_read(n: int, repeats: int, tmp: str) -> dict[str, Any]:
    """Write n events to a SQLite file with the recorder's writer, then time modtrace.store.reader.read_events."""
    from modtrace.core.contracts import Batch
    from modtrace.store.engine import open_store
    from modtrace.store.reader import read_events
    from modtrace.store.runs import add_rank, create_run
    from modtrace.store.writer import EVENT_COLUMNS, RankWriter

    events, mods, devs = generate(n)
    path = os.path.join(tmp, f"read_{n}.db")
    store = open_store(path, create=True)
    try:
        run_id, _ = create_run(store, "bench", {})
        add_rank(store, run_id, 0, 0)
        writer = RankWriter(store, run_id, 0)
        writer.write(Batch([], modules=mods.drop("rank").rows(), threads=[(0, 1, "MainThread")], devices=[(0, "cpu")]))
        t0 = time.perf_counter()
        for start in range(0, events.height, 500_000):
            writer.write(Batch(events.slice(start, 500_000).select(EVENT_COLUMNS).rows()))
        write_s = time.perf_counter() - t0
        expected = events.height
        del events
        read_s: list[float] = []
        load_before = load_average()
        for _ in range(repeats):
            gc.collect()
            t0 = time.perf_counter()
            frame = read_events(store, run_id)
            read_s.append(time.perf_counter() - t0)
            assert frame.height == expected
            del frame
        load_after = load_average()
    finally:
        store.dispose()
    median = statistics.median(read_s)
    return {"events": expected, "sqlite_write_s": write_s, "sqlite_read_median_s": median, "sqlite_read_runs_s": read_s,
            "read_events_per_s": expected / median, "read_us_per_event": median / expected * 1e6,
            "load_average_before": load_before, "load_average_after": load_after}


# ------------------------------------------------------- end to end, on a store


def _write_recording(url: str, n: int) -> int:
    """A run of n events (generate()'s shape) written by the recorder's writer; its run id."""
    from modtrace.core.contracts import Batch
    from modtrace.store.engine import open_store
    from modtrace.store.runs import add_rank, create_run, finish_rank
    from modtrace.store.writer import EVENT_COLUMNS, RankWriter

    events, mods, _ = generate(n)
    store = open_store(url, create=True)
    try:
        run_id, _ = create_run(store, "bench", {})
        add_rank(store, run_id, 0, 0)
        writer = RankWriter(store, run_id, 0)
        writer.write(Batch([], modules=mods.drop("rank").rows(), threads=[(0, 1, "MainThread")], devices=[(0, "cpu")]))
        for start in range(0, events.height, 250_000):
            part = events.slice(start, 250_000)
            writer.write(Batch(part.select(EVENT_COLUMNS).rows(), progress=(start + part.height, int(part["step"].max()) + 1)))
        finish_rank(store, run_id, 0, "completed")
    finally:
        store.dispose()
    return run_id


def plain_loop(path: str, run_id: int) -> int:
    """The baseline: a straightforward sqlite3 read of the run's rows and the Python stack loop."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT seq, ts_ns, kind, module_id, phase, call_id, step, thread_id, status, graph_task, tie "
            "FROM events WHERE run_id = ? AND rank = 0 ORDER BY seq", (run_id,)).fetchall()
        depth_of = {m: 0 for m in range(build_model()[0].height)}
        spans, _ = python_analysis(rows, depth_of)
    finally:
        conn.close()
    return len(spans)


def _cli(args: list[str], db: str) -> float:
    """Wall time of one modtrace command in a fresh interpreter, as a user runs it."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "modtrace", *args, "--db", db], capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):  # check exits 1 on errors
        raise SystemExit(f"modtrace {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall


# The floor of ``modtrace analyze``: a fresh interpreter importing what analyze imports,
# opening the store and running analyze's rounds (read events, analyse), storing nothing.
_FLOOR = """
import sys
from modtrace.results.materialize import _Found, _complete, _rounds
from modtrace.store.engine import open_store
from modtrace.store.reader import read_ranks
import modtrace.store.analysis_store, modtrace.results.tree  # analyze imports them too
store = open_store(sys.argv[1])
run_id = int(sys.argv[2])
ranks = read_ranks(store, run_id)
from modtrace.results.materialize import ROUND_ROWS, CHUNK_ROWS
spans = sum(s.height for s, _, _ in _rounds(store, run_id, ranks, _complete(store, run_id, None, None),
                                            ROUND_ROWS, CHUNK_ROWS, _Found()))
store.dispose()
"""


def _floor(db: str, run_id: int) -> float:
    """Wall time of ``_FLOOR`` in a fresh interpreter."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", _FLOOR, db, str(run_id)], check=True)
    return time.perf_counter() - t0


def _file_size(path: str) -> int:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute("VACUUM")
    finally:
        conn.close()
    return os.path.getsize(path)


def measure_end_to_end(n: int, repeats: int, tmp: str, pg_url: str | None) -> dict[str, Any]:
    """The issue's analysis rows, side by side on one recording: the plain loop, ``modtrace analyze``,
    ``tree``, ``check``, ``export --format perfetto`` (each a fresh ``modtrace`` process), the
    floor of ``analyze`` on SQLite (a fresh process doing analyze's reading and analysing,
    storing nothing: ``_FLOOR``), and the SQLite file's bytes per event and per span after VACUUM.  Repeats are interleaved."""
    import shutil

    path = os.path.join(tmp, f"e2e_{n}.db")
    run_id = _write_recording(path, n)
    events_only = _file_size(path)
    perfetto = os.path.join(tmp, "trace.json")
    targets: dict[str, str] = {"sqlite": path}
    if pg_url:
        from sqlalchemy import create_engine, text

        admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("DROP SCHEMA IF EXISTS modtrace_bench_e2e CASCADE"))
            conn.execute(text("CREATE SCHEMA modtrace_bench_e2e"))
        admin.dispose()
        sep = "&" if "?" in pg_url else "?"
        targets["postgresql"] = f"{pg_url}{sep}options=-csearch_path%3Dmodtrace_bench_e2e"
        _write_recording(targets["postgresql"], n)
    times: dict[str, dict[str, list[float]]] = {d: {} for d in targets}
    plain: list[float] = []
    spans = 0
    floor: list[float] = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        spans = plain_loop(path, run_id)
        plain.append(time.perf_counter() - t0)
        floor.append(_floor(path, run_id))
        for dialect, db in targets.items():
            row = times[dialect]
            row.setdefault("analyze", []).append(_cli(["analyze", "bench"], db))
            row.setdefault("tree", []).append(_cli(["tree", "bench"], db))
            row.setdefault("check", []).append(_cli(["check", "bench"], db))
            row.setdefault("export_perfetto", []).append(
                _cli(["export", "bench", "--format", "perfetto", "-o", perfetto, "-q"], db))
    if pg_url:
        admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("DROP SCHEMA IF EXISTS modtrace_bench_e2e CASCADE"))
        admin.dispose()
    copy = os.path.join(tmp, "sized.db")
    shutil.copyfile(path, copy)
    total = _file_size(copy)
    plain_s = statistics.median(plain)
    out: dict[str, Any] = {"events": n, "spans": spans, "plain_loop_median_s": plain_s,
                           "sqlite_read_and_analyse_only_median_s": statistics.median(floor),
                           # the most analyze could reach over the plain loop if writing cost nothing
                           "sqlite_floor_vs_plain_loop": plain_s / statistics.median(floor),
                           "bytes_per_event": events_only / n, "bytes_per_span": (total - events_only) / spans,
                           "sqlite_file_bytes": total}
    for dialect, row in times.items():
        medians = {k: statistics.median(v) for k, v in row.items()}
        out[dialect] = {**{f"{k}_median_s": v for k, v in medians.items()},
                        "analyze_vs_plain_loop": plain_s / medians["analyze"],
                        "analyze_us_per_span": medians["analyze"] / spans * 1e6,
                        "runs_s": row}
    return out


def print_end_to_end(e2e: dict[str, Any]) -> None:
    """The issue's table rows, one line each, with the goal beside the figure."""
    print(f"end to end, {e2e['events']:,} events -> {e2e['spans']:,} spans (medians of interleaved repeats)")
    print(f"  {'what':<34}{'sqlite':>12}{'postgresql':>14}   goal")
    dialects = [d for d in ("sqlite", "postgresql") if d in e2e]

    def line(what: str, key: str, fmt: str, goal: str) -> None:
        cells = "".join(f"{fmt.format(e2e[d][key]):>{12 if i == 0 else 14}}" for i, d in enumerate(dialects))
        print(f"  {what:<34}{cells}   {goal}")

    print(f"  {'plain loop (sqlite3 + Python)':<34}{e2e['plain_loop_median_s']:>11.2f}s")
    line("modtrace analyze", "analyze_median_s", "{:.2f}s", "")
    line("  speed-up over the plain loop", "analyze_vs_plain_loop", "{:.2f}x", ">= 3x")
    line("  whole command, us per span", "analyze_us_per_span", "{:.2f}", "")
    print(f"  {'  floor: read + analyse, no write':<34}{e2e['sqlite_read_and_analyse_only_median_s']:>11.2f}s")
    print(f"  {'    plain loop over the floor':<34}{e2e['sqlite_floor_vs_plain_loop']:>11.2f}x"
          "   (the best analyze could do with a free write)")
    line("modtrace tree", "tree_median_s", "{:.2f}s", "<= 1 s")
    line("modtrace check", "check_median_s", "{:.2f}s", "<= 1 s")
    line("modtrace export --format perfetto", "export_perfetto_median_s", "{:.2f}s", "<= 1 s")
    print(f"  {'bytes per event (after VACUUM)':<34}{e2e['bytes_per_event']:>12.1f}{'':>14}   <= 40")
    print(f"  {'bytes per span (after VACUUM)':<34}{e2e['bytes_per_span']:>12.1f}{'':>14}   <= 48")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--python-repeats", type=int, default=3)
    parser.add_argument("--read-sizes", default="1000000")
    parser.add_argument("--read-repeats", type=int, default=3)
    parser.add_argument("--skip-read", action="store_true")
    parser.add_argument("--skip-rebuild", action="store_true", help="skip the in-memory polars vs Python rows")
    parser.add_argument("--e2e-events", type=int, default=1_000_000, help="events of the end-to-end recording (0: skip)")
    parser.add_argument("--e2e-repeats", type=int, default=3)
    parser.add_argument("--pg", default=None, help="also run end to end on this PostgreSQL URL (a scratch schema)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child_polars(args.child)
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    summary: dict[str, Any] = {
        "benchmark": "analysis",
        "modules": build_model()[0].height,
        "cpus": os.cpu_count(),
        "polars_version": pl.__version__,
        "polars_threads": pl.thread_pool_size(),
        "POLARS_MAX_THREADS": os.environ.get("POLARS_MAX_THREADS"),
        "load_average_start": load_average(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        if args.e2e_events:
            summary["end_to_end"] = measure_end_to_end(args.e2e_events, args.e2e_repeats, tmp, args.pg)
            print_end_to_end(summary["end_to_end"])
        if args.skip_rebuild:
            sizes = []
        results = measure_sizes(sizes, args.repeats, args.python_repeats, tmp) if sizes else []
        summary["sizes"] = results
        if len(results) >= 2:
            small, big = results[0], results[-1]
            summary["growth"] = {
                "events_ratio": big["events"] / small["events"],
                "polars_time_ratio": big["polars_median_s"] / small["polars_median_s"],
            }
        growth = summary.get("growth")
        e2e = summary.get("end_to_end")
        summary["criteria"] = {
            # None: not measured in this run (--skip-rebuild), never a vacuous true
            "speedup_at_least_3x": all(r["speedup"] >= 3 for r in results) if results else None,
            "analyze_at_least_3x_the_plain_loop": None if e2e is None else all(
                e2e[d]["analyze_vs_plain_loop"] >= 3 for d in ("sqlite", "postgresql") if d in e2e),
            "tree_check_export_at_most_1s": None if e2e is None else all(
                e2e[d][f"{k}_median_s"] <= 1 for d in ("sqlite", "postgresql") if d in e2e
                for k in ("tree", "check", "export_perfetto")),
            "storage_within_40_per_event_48_per_span": None if e2e is None else
            e2e["bytes_per_event"] <= 40 and e2e["bytes_per_span"] <= 48,
            "peak_rss_at_most_3gb": all(r["child"]["peak_rss_mb"] <= 3 * 1024 for r in results) if results else None,
            "linear_growth_at_most_11x_per_10x": None if growth is None
            else growth["polars_time_ratio"] <= 1.1 * growth["events_ratio"],
        }
        if not args.skip_read:
            summary["sqlite_read"] = [measure_read(int(s), args.read_repeats, tmp)
                                      for s in args.read_sizes.split(",") if s]
    summary["load_average_end"] = load_average()
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
