"""How closely each candidate speed probe follows a training step's speed, run to run.

    .venv/bin/python benchmarks/probe_tracking.py [--runs 14] [--steps 20] [--loads 0,1] [--pause 2]

A history gate divides each step's time by a probe timed just before it, so
a probe is as good as its ratio to the step is steady across runs of the
same code while the machine's speed moves.  Side by side in one process,
per step and in turn, with no recorder: the probes below, then one training
step of ``gate_power.py``'s model (4 blocks, width 128, batch 32, SGD, one
intra-op thread) timed on the thread's CPU clock.  Per run the median of
each; over ``--runs`` runs (``--pause`` seconds apart, so the machine's speed
has time to move) per load (busy processes beside it):

- ``forward``: 20 matmul + tanh layers without autograd (the probe of schema
  revisions 0017 and 0018);
- ``python``: a loop of 400 small method calls (interpreter speed alone);
- ``train``: the probe modtrace takes (``SpeedProbe``: 6 layers forward with
  autograd, then backward).

Prints, per load and probe, the spread of log(step / probe) across runs (the
smaller, the better the probe follows the step: 0.05 is about 5%), beside
the spread of log(step) itself, and the slope of log(step) on log(probe)
(1: step and probe slow alike).  One JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._common import busy_processes, gate_model, python_loop_probe  # noqa: E402


def probes() -> dict[str, Callable[[], int]]:
    """Each candidate probe: a function that runs it once and returns its wall time (ns)."""
    import torch

    from modtrace.recording.speed_probe import SpeedProbe

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 128, generator=gen)
    w = torch.randn(128, 128, generator=gen) / 128 ** 0.5
    now = time.perf_counter_ns

    def forward() -> int:
        t0 = now()
        with torch.no_grad():
            y = x
            for _ in range(20):
                y = torch.tanh(y @ w)
        return now() - t0

    python = python_loop_probe(now)

    probe = SpeedProbe(now, cpu=False)

    def train() -> int:
        probe.take(0, 0)
        return probe.rows.pop()[3]

    return {"forward": forward, "python": python, "train": train}


def one_run(steps: int, candidates: dict[str, Callable[[], int]]) -> dict[str, float]:
    """Median step CPU time and median time of each probe over ``steps`` steps (2 warm-up steps)."""
    import torch

    model = gate_model()
    x = torch.randn(32, 128)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    seen: dict[str, list[int]] = {name: [] for name in ("step", *candidates)}
    for s in range(steps + 2):
        took = {name: fn() for name, fn in candidates.items()}
        c0 = time.thread_time_ns()
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        took["step"] = time.thread_time_ns() - c0
        if s >= 2:
            for name, t in took.items():
                seen[name].append(t)
    return {name: float(statistics.median(v)) for name, v in seen.items()}


def slope(ys: list[float], xs: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=14)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--loads", default="0,1", help="busy processes beside the runs, comma-separated")
    p.add_argument("--pause", type=float, default=2.0, help="seconds between runs")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    candidates = probes()
    out: dict[str, Any] = {}
    print(f"runs {args.runs}, steps {args.steps}, one thread; spread = standard deviation across runs")
    print(f"{'busy procs':>10}  {'probe':<8} {'sd log(step/probe)':>19} {'sd log(step)':>13} {'slope':>6}")
    for load in (int(v) for v in args.loads.split(",") if v):
        spinners = busy_processes(load)
        try:
            time.sleep(1)
            runs = []
            for _ in range(args.runs):
                runs.append(one_run(args.steps, candidates))
                time.sleep(args.pause)
        finally:
            for s in spinners:
                s.kill()
                s.wait()
        step = [math.log(r["step"]) for r in runs]
        for name in candidates:
            logs = [math.log(r[name]) for r in runs]
            ratio = statistics.pstdev([a - b for a, b in zip(step, logs, strict=True)])
            k = slope(step, logs)
            out[f"{load}|{name}"] = {"sd_log_ratio": round(ratio, 4), "slope": round(k, 3)}
            print(f"{load:>10}  {name:<8} {ratio:>19.3f} {statistics.pstdev(step):>13.3f} {k:>6.2f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
