#!/usr/bin/env python3
"""Compiled models: what recording the time per inner module costs.

A model of ``--blocks`` blocks (LayerNorm, nn.MultiheadAttention, an MLP),
width ``--width``, compiled whole with inductor (CPU), trained with SGD.  In
one process, taking turns (benchmarks/_common.py ``interleave``):

* ``bare``: no recorder;
* ``whole``: ``Recorder(compiled_detail=False)``: hooks only, the compiled
  model one call (what modtrace recorded before);
* ``detail``: ``Recorder()`` (the default): kernels timed and attributed to
  the inner modules, every step;
* ``scheduled``: ``Recorder(schedule="wait=3,active=1")``: a step of four recorded;
* ``profiler``: ``torch.profiler.profile(activities=[CPU])`` and no recorder:
  what shows a compiled model's kernel times today (names, no modules).

Each candidate times ``--steps`` steps after three untimed ones; the table gives
the median step and the ratio to ``bare``.  With ``--compile-time`` it also
times the first step (dynamo + inductor compile) in fresh processes with an
empty inductor cache, bare and recorded, and a warm cache (the second process).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import modtrace  # noqa: E402
from benchmarks._common import interleave, load_average, medians, ratios  # noqa: E402


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Net(nn.Module):
    def __init__(self, blocks: int, d: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(blocks)])
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).sum()


def first_step(args: argparse.Namespace, recorded: bool, db: str) -> float:
    """Seconds of the first (compiling) step, in this process."""
    torch.manual_seed(0)
    model = Net(args.blocks, args.width)
    compiled = torch.compile(model)
    x = torch.randn(args.batch, args.seq, args.width)
    with modtrace.Recorder(db=db, analyze=False, counters="off") if recorded else contextlib.nullcontext():
        t0 = time.perf_counter()
        compiled(x).backward()
        return time.perf_counter() - t0


def compile_times(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-compiled-"))
    for label, recorded_first, recorded_second in (("bare", False, False), ("recorded", True, True),
                                                   ("bare cache, then recorded", False, True)):
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp / label.replace(" ", "_").replace(",", "")))
        times = []
        for recorded in (recorded_first, recorded_second):
            out = subprocess.run([sys.executable, __file__, "--first-step", "1" if recorded else "0",
                                  "--blocks", str(args.blocks), "--width", str(args.width),
                                  "--db", str(tmp / "compile.db")],
                                 env=env, check=True, capture_output=True, text=True)
            times.append(float(out.stdout.strip().splitlines()[-1]))
        print(f"first step, {label:<26} cold cache {times[0]:7.1f} s   warm cache {times[1]:7.1f} s")


def per_kernel_cost(n: int = 200_000) -> tuple[float, float]:
    """The hot path alone: ns per call of a do-nothing kernel, bare and wrapped (timed,
    appending its tuple), medians of 5 interleaved rounds."""
    from modtrace.tracking import compiled as detail

    def kernel() -> None:
        return None

    wrapped = detail._timed(kernel, "k", time.perf_counter_ns)
    bare_ns, wrapped_ns = [], []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            kernel()
        bare_ns.append((time.perf_counter_ns() - t0) / n)
        detail._active.buf = []
        detail._active.dev = None  # kernels timed on the host clock (a CPU graph)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            wrapped()
        wrapped_ns.append((time.perf_counter_ns() - t0) / n)
        del detail._active.buf
    return sorted(bare_ns)[2], sorted(wrapped_ns)[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compile-time", action="store_true")
    parser.add_argument("--first-step", choices=("0", "1"))
    parser.add_argument("--db")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.first_step is not None:
        print(first_step(args, args.first_step == "1", args.db))
        return
    torch.manual_seed(0)
    model = Net(args.blocks, args.width)
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.seq, args.width)

    def step() -> None:
        compiled(x).backward()
        opt.step()
        opt.zero_grad()

    tmp = Path(tempfile.mkdtemp(prefix="bench-compiled-"))
    runs = iter(range(1_000_000))
    # Compile once under a recorder, so the graphs carry their call sites.
    with modtrace.Recorder(db=str(tmp / "warm.db"), analyze=False, counters="off"):
        step()

    def steps(**options: object) -> float:
        def timed() -> float:
            for _ in range(3):  # untimed: the recorder's writer process starts meanwhile
                step()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            return (time.perf_counter() - t0) / args.steps
        if options.get("bare"):
            return timed()
        if options.get("profiler"):  # what a user reaches for today to see kernel times
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]):
                return timed()
        with modtrace.Recorder(db=str(tmp / "bench.db"), run=f"r{next(runs)}", analyze=False, counters="off",
                               **options):  # type: ignore[arg-type]
            return timed()

    candidates = {"bare": lambda: steps(bare=True), "whole": lambda: steps(compiled_detail=False),
                  "detail": lambda: steps(), "scheduled": lambda: steps(schedule="wait=3,active=1"),
                  "profiler": lambda: steps(profiler=True)}
    print(f"load average before: {load_average()}")
    samples = interleave(candidates, args.repeats, own_time=candidates)
    meds = medians(samples.wall)
    vs = ratios(meds, "bare")
    print(f"{args.blocks} blocks, width {args.width}, batch {args.batch} x seq {args.seq}, compiled whole; "
          f"{args.steps} steps x {args.repeats} repeats, 1 thread")
    print(f"{'candidate':<10} {'step ms (median)':>17} {'vs bare':>8}")
    for name, value in meds.items():
        print(f"{name:<10} {value * 1e3:>17.3f} {vs.get(name, 1.0):>8.2f}")
    bare_ns, wrapped_ns = per_kernel_cost()
    print(f"per kernel call: bare {bare_ns:.0f} ns, timed {wrapped_ns:.0f} ns (+{wrapped_ns - bare_ns:.0f} ns)")
    print(f"load average after: {load_average()}")
    if args.compile_time:
        compile_times(args)


if __name__ == "__main__":
    main()
