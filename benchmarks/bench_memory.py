#!/usr/bin/env python3
"""Memory per call (issue 41): what it costs where it runs, and where it must cost nothing.

Two sections (``--sections``):

* ``analysis``: ``analysis.memory.span_memory`` (kept and peak bytes of every span) and
  ``live_levels`` on a synthetic counted range of ``--spans`` spans (a forward of nested
  blocks, depth 4, each leaf allocating two storages and freeing one, the backward freeing the
  rest), median of ``--repeats``.
* ``hooks`` (needs ``--other-tree DIR``, a checkout without the memory code): the forward hooks
  on steps that are not counted (``Recorder(counters="first")`` after its counted step): a
  process per candidate per repeat, taking turns, each timing the CPU seconds of ``--calls``
  forward calls of a 100-block Linear stack; medians and this/other.  The forward exit now
  checks whether a counted region is open (one attribute read): this says whether it shows.

The cost of a counted step with memory against the work counters alone is
``benchmarks/bench_counters.py`` (``counted`` against ``counted-no-memory``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import interleave, load_average, medians  # noqa: E402

HERE = Path(__file__).resolve().parents[1]

_HOOKS = r"""
import os, sys, time, tempfile
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch, modtrace
torch.set_num_threads(1)
model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(100)])
x = torch.randn(2, 8)
calls = int(sys.argv[1])
with torch.no_grad(), modtrace.Recorder(db=os.path.join(tempfile.mkdtemp(), "b.db"), analyze=False,
                                        counters="first", writer="thread"):
    model(x)  # the counted step (first of its kind)
    t0 = time.process_time()
    for _ in range(calls):
        model(x)
    print(time.process_time() - t0)
"""


def synthetic(spans: int, per_root: bool = False) -> tuple[object, object, object]:
    """A counted range of nested blocks (``per_root``: each root block a range of its own, as
    ``counters="every-step"`` gives a step each)."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(0)
    rows: list[list[int | None]] = []  # span_id, parent, exit, call_id, phase
    storages: list[list[int | None]] = []  # sid, alloc, free, call_id, nbytes
    seq = 1
    call = 1
    sid = 0
    live: list[int] = []

    def block(parent: int | None, depth: int) -> None:
        nonlocal seq, call, sid
        me, my_call = seq, call
        seq += 1
        call += 1
        idx = len(rows)
        rows.append([me, parent, None, my_call, 0])
        if depth < 3:
            for _ in range(4):
                block(me, depth + 1)
        else:
            for _ in range(2):
                storages.append([sid, seq, None, my_call, int(rng.integers(1, 1 << 16))])
                live.append(len(storages) - 1)
                sid += 1
            storages[live.pop(0 if rng.random() < 0.5 else -1)][2] = seq
        rows[idx][2] = seq
        seq += 1

    while len(rows) < spans:
        block(None, 0)
    for i in live:
        storages[i][2] = seq + 1
    span_frame = pl.DataFrame(rows, schema=["span_id", "parent_span_id", "exit_seq", "call_id", "phase"], orient="row")
    span_frame = span_frame.with_columns(pl.lit(0).alias("rank"), pl.lit(-1).alias("graph_task"),
                                         pl.lit(0).alias("thread_id"), pl.lit(0).alias("device_id"))
    s = pl.DataFrame(storages, schema=["sid", "alloc_seq", "free_seq", "call_id", "nbytes"], orient="row")
    s = s.with_columns(pl.lit(0).alias("rank"), pl.lit(1).alias("first_seq"), pl.lit(0).alias("device"),
                       (pl.col("sid") + 10_000_000).alias("free_order"), pl.lit(0).alias("phase"),
                       pl.lit(-1).alias("graph_task"))
    ranges = pl.DataFrame({"rank": [0], "first_seq": [1], "last_seq": [seq + 1]})
    if per_root:
        roots = span_frame.filter(pl.col("parent_span_id").is_null())
        ranges = pl.DataFrame({"rank": [0] * roots.height, "first_seq": roots["span_id"], "last_seq": roots["exit_seq"]})
        s = s.drop("first_seq").sort("alloc_seq").join_asof(ranges.select("first_seq").sort("first_seq"),
                                                            left_on="alloc_seq", right_on="first_seq", strategy="backward")
    return span_frame, s, ranges


def analysis(args: argparse.Namespace) -> None:
    from modtrace.analysis.memory import live_levels, span_memory

    spans, storages, ranges = synthetic(args.spans, args.per_root)
    times: dict[str, list[float]] = {"span_memory": [], "live_levels": []}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = span_memory(spans, storages, ranges)  # type: ignore[arg-type]
        times["span_memory"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        live_levels(storages)  # type: ignore[arg-type]
        times["live_levels"].append(time.perf_counter() - t0)
    print(f"analysis: {spans.height} spans, {storages.height} storages, {ranges.height} ranges, "  # type: ignore[attr-defined]
          f"{out.height} rows out")
    for name, values in times.items():
        print(f"  {name:<12} {statistics.median(values) * 1e3:8.1f} ms (median of {args.repeats})")


def hooks(args: argparse.Namespace) -> None:
    if args.other_tree is None:
        raise SystemExit("--sections hooks needs --other-tree DIR")
    trees = {"this": HERE, "other": Path(args.other_tree).resolve()}

    def run(tree: Path) -> float:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, "-c", _HOOKS, str(args.calls)], env=env, capture_output=True,
                              text=True, check=True, cwd=tree)
        return float(done.stdout.strip().splitlines()[-1])

    print(f"load average before: {load_average()}")
    def candidate(tree: Path) -> Callable[[], float]:
        return lambda: run(tree)

    samples = interleave({name: candidate(tree) for name, tree in trees.items()}, args.repeats, own_time=trees)
    meds = medians(samples.wall)
    print(f"hooks: {args.calls} forwards of 100 Linear(8,8) (101 module calls each), steps not counted, "
          f"CPU seconds of the loop, medians of {args.repeats}")
    for name, value in meds.items():
        print(f"  {name:<6} {value:8.3f} s  ({value / (args.calls * 101) * 1e9:6.0f} ns per module call)")
    print(f"  this/other {meds['this'] / meds['other']:.3f}")
    print(f"load average after: {load_average()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="analysis")
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--other-tree", default=None)
    parser.add_argument("--per-root", action="store_true", help="each root block a counted range (every-step)")
    args = parser.parse_args()
    for section in args.sections.split(","):
        {"analysis": analysis, "hooks": hooks}[section](args)


if __name__ == "__main__":
    main()
