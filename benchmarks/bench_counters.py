#!/usr/bin/env python3
"""Work counters' cost: step time with counting on a counted step and on the others.

A ``blocks`` x (Linear(16,16) + ReLU) Sequential, batch ``--batch``, forward +
backward + SGD step, one CPU thread, each candidate a fresh ``modtrace.Recorder``
on a SQLite file (``analyze=False``; entering and leaving are off the clock):

* ``bare``: no recorder;
* ``off``: ``Recorder(counters="off")``, the recorder without counters;
* ``first``: ``Recorder(counters="first")`` (the default) after its counted first
  step: the steps that are not counted, which must cost what ``off`` costs;
* ``counted``: ``Recorder(counters="every-step")``: every step counted (work and memory);
* ``counted-no-memory``: the same with the memory log left out (the recorder's
  ``Counting.memory`` off): the work counters alone, to state memory's share.

Each candidate times ``--steps`` steps after one untimed step and reports the
mean step; candidates take turns over ``--repeats`` repeats (benchmarks/_common.py
``interleave``) and the table gives medians and ratios to ``off``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

import modtrace  # noqa: E402
from benchmarks._common import interleave, linear_relu_stack, load_average, medians, ratios  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = linear_relu_stack(args.blocks)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, 16)

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    tmp = Path(tempfile.mkdtemp(prefix="bench-counters-"))
    runs = iter(range(1_000_000))

    def steps(counters: str | None, memory: bool = True) -> float:
        if counters is None:
            step()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            return (time.perf_counter() - t0) / args.steps
        with modtrace.Recorder(db=str(tmp / "bench.db"), run=f"r{next(runs)}", analyze=False, counters=counters) as rec:
            if rec._counting is not None:
                rec._counting.memory = memory
            step()  # the first step: counted under every policy but off
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            return (time.perf_counter() - t0) / args.steps

    candidates = {"bare": lambda: steps(None), "off": lambda: steps("off"), "first": lambda: steps("first"),
                  "counted": lambda: steps("every-step"), "counted-no-memory": lambda: steps("every-step", False)}
    print(f"load average before: {load_average()}")
    samples = interleave(candidates, args.repeats, own_time=candidates)
    meds = medians(samples.wall)
    vs_off = ratios(meds, "off")
    print(f"{args.blocks} x (Linear(16,16) + ReLU), batch {args.batch}, {args.steps} steps x {args.repeats} repeats")
    print(f"{'candidate':<18} {'step ms (median)':>17} {'vs off':>8}")
    for name, value in meds.items():
        print(f"{name:<18} {value * 1e3:>17.3f} {vs_off.get(name, 1.0):>8.2f}")
    print(f"counted / counted-no-memory: {meds['counted'] / meds['counted-no-memory']:.2f}")
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
