"""How much of the run-to-run spread of a step's CPU time belongs to the run itself?

    .venv/bin/python benchmarks/instance_spread.py [--instances 12] [--rounds 4] [--steps 20] [--load 0]

A CI gate compares whole runs, and each run builds its model anew: new tensors
at new addresses, a new speed probe.  This script builds ``--instances``
copies of the regression gate's model (``_common.gate_model``, one intra-op
thread, each with its own optimizer, input and ``SpeedProbe``) in one
process, then measures them in ``--rounds`` interleaved rounds (each round
visits every instance in a new random order): per visit, the median over
``--steps`` training steps of the thread's CPU time per step, and of the
probe taken before each step.

The spread of log(step) and of log(step / probe) is split in two: between
instances (the spread of each instance's mean over the rounds) and within an
instance (the spread of its visits around its own mean, pooled).  Within is
what the machine's speed changes from one minute to the next; between, less
what within contributes to a mean of ``--rounds`` visits, is what a fresh
copy of the same code brings with it, which no probe of the machine's speed
can remove.  ``--load`` starts busy processes beside it.  No recorder: this
measures the program and the probe, not modtrace's hooks.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this tree's benchmarks and modtrace

from benchmarks._common import busy_processes, gate_model  # noqa: E402


def instance(seed: int, width: int, batch: int) -> tuple[Any, Any]:
    """One fresh copy: a training step of the gate's model, and a speed probe on the CPU clock."""
    import torch

    from modtrace.recording.speed_probe import SpeedProbe

    net = gate_model(4, width)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed))

    def step() -> None:
        net(x).sum().backward()
        opt.step()
        opt.zero_grad()

    return step, SpeedProbe(time.thread_time_ns, cpu=False)


def visit(step: Any, probe: Any, steps: int) -> tuple[float, float]:
    """(median CPU ns per step, median probe ns) over ``steps`` steps, a probe before each."""
    times = []
    for i in range(steps):
        probe.take(i, 0)
        t = time.thread_time_ns()
        step()
        times.append(time.thread_time_ns() - t)
    probes = [row[3] for row in probe.rows[-steps:]]
    return statistics.median(times), statistics.median(probes)


def split(values: dict[int, list[float]]) -> tuple[float, float]:
    """Per instance its visits' logs -> (sd of the instances' means, pooled sd within an instance)."""
    means = [statistics.fmean(v) for v in values.values()]
    within = [x - statistics.fmean(v) for v in values.values() for x in v]
    dof = sum(len(v) - 1 for v in values.values())
    return statistics.stdev(means), math.sqrt(sum(w * w for w in within) / dof)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=12)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--load", type=int, default=0, help="busy processes beside it")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    copies = [instance(i, args.width, args.batch) for i in range(args.instances)]
    for step, probe in copies:  # warm-up: the first steps allocate
        visit(step, probe, 3)
    busy = busy_processes(args.load)
    try:
        step_logs: dict[int, list[float]] = {i: [] for i in range(args.instances)}
        ratio_logs: dict[int, list[float]] = {i: [] for i in range(args.instances)}
        order = list(range(args.instances))
        rng = random.Random(0)
        for _ in range(args.rounds):
            rng.shuffle(order)
            for i in order:
                s, pr = visit(*copies[i], args.steps)
                step_logs[i].append(math.log(s))
                ratio_logs[i].append(math.log(s / pr))
    finally:
        for b in busy:
            b.kill()
            b.wait()
    print(f"{args.instances} instances x {args.rounds} rounds x {args.steps} steps, {args.load} busy processes, "
          "one intra-op thread, the thread's CPU clock")
    print(f"{'measure':<14} {'sd between instances':>21} {'sd within (visits)':>19} {'between, net of within':>23}")
    for name, logs in (("step", step_logs), ("step / probe", ratio_logs)):
        between, within = split(logs)
        net = math.sqrt(max(0.0, between ** 2 - within ** 2 / args.rounds))
        print(f"{name:<14} {between:>21.4f} {within:>19.4f} {net:>23.4f}")
    spans = [math.exp(max(statistics.fmean(v) for v in step_logs.values())
                      - min(statistics.fmean(v) for v in step_logs.values()))]
    print(f"instances' mean step time, max / min: {spans[0]:.3f}")


if __name__ == "__main__":
    main()
