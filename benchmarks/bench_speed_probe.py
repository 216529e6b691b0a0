"""What the speed probe costs a step, beside the recorder with either writer.

    .venv/bin/python benchmarks/bench_speed_probe.py [--repeats 10] [--steps 40]

The gate's model (``gate_power.py``: 4 blocks, each a Linear applied 10 times, width 128,
batch 32, SGD, one intra-op thread) trained for ``--steps`` steps, side by side in one
process, interleaved repeats, medians:

- ``bare``: no recorder;
- ``recorder``: ``modtrace.Recorder()`` as it is by default (on two or more CPUs its
  batches go to a writer process, working beside the steps);
- ``recorder_inline``: ``Recorder(writer="inline")``, batches written by the program at
  step boundaries;
- ``recorder_probe``: ``Recorder(speed_probe=True)``: the probe before each step (the
  writer as by default).

Per candidate: the wall time per step as the loop sees it (the probe and the writes at the
boundaries included), its ratio to ``bare``, and the spread of one run's step times (the
90th over the 10th percentile, and the share of steps over 1.5 times the run's median): what
a regression gate has to see through.  For ``recorder_probe`` the probe's median time and
its share of the step.  Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._common import gate_model, interleave, load_average, median  # noqa: E402

CANDIDATES = ("bare", "recorder", "recorder_inline", "recorder_probe")


def quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    i = q * (len(v) - 1)
    lo = int(i)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)


def one_run(name: str, db: str, steps: int, rep: int, out: dict[str, list[Any]]) -> float:
    """Train ``steps`` steps under candidate ``name``; returns seconds per step (timed steps only)."""
    import torch

    import modtrace

    net = gate_model()
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    x = torch.randn(32, 128, generator=torch.Generator().manual_seed(1))
    options: dict[str, Any] = {"recorder": {}, "recorder_inline": {"writer": "inline"},
                               "recorder_probe": {"speed_probe": True}}.get(name, {})
    rec = None if name == "bare" else modtrace.Recorder(db=db, run=f"{name}-{rep}", analyze=False,
                                                        handle_sigterm=False, **options)
    times = []
    if rec is not None:
        rec.start()
    try:
        for _ in range(steps + 1):  # the first step is the process's warm-up within the run
            t0 = time.perf_counter()
            net(x).sum().backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
    finally:
        if rec is not None:
            rec.finish()
    timed = times[1:]
    mid = median(timed)
    out[name].append({"spread": quantile(timed, 0.9) / quantile(timed, 0.1),
                      "slow": sum(t > 1.5 * mid for t in timed) / len(timed)})
    if name == "recorder_probe":
        con = sqlite3.connect(db)
        try:
            probes = [p for (p,) in con.execute(
                "SELECT probe_ns FROM step_speeds s JOIN runs r ON r.id = s.run_id WHERE r.name = ?", (f"{name}-{rep}",))]
        finally:
            con.close()
        out["probe_ms"].append(median(probes) / 1e6)
    return sum(timed) / len(timed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    out: dict[str, list[Any]] = {n: [] for n in (*CANDIDATES, "probe_ms")}
    load_before = load_average()
    with tempfile.TemporaryDirectory() as d:
        db = str(Path(d) / "bench.db")
        reps = dict.fromkeys(CANDIDATES, 0)

        def run(name: str) -> float:
            reps[name] += 1
            return one_run(name, db, args.steps, reps[name], out)

        for name in CANDIDATES:  # warm-up: imports, the first recorder's set-up
            one_run(name, db, 3, -1, {n: [] for n in (*CANDIDATES, "probe_ms")})
        samples = interleave({n: partial(run, n) for n in CANDIDATES}, args.repeats, rng=random.Random(0),
                             own_time=CANDIDATES)
    med = samples.medians()
    step_ms = {n: med[n] * 1e3 for n in CANDIDATES}
    spread = {n: median(r["spread"] for r in out[n]) for n in CANDIDATES}
    slow = {n: median(r["slow"] for r in out[n]) for n in CANDIDATES}
    probe_ms = median(out["probe_ms"])
    print(f"steps {args.steps}, repeats {args.repeats}, one thread; load average before {load_before}, "
          f"after {load_average()}")
    print(f"{'candidate':<16} {'ms/step':>8} {'x bare':>7} {'q90/q10':>8} {'steps > 1.5x median':>20}")
    for n in CANDIDATES:
        print(f"{n:<16} {step_ms[n]:>8.3f} {step_ms[n] / step_ms['bare']:>7.3f} {spread[n]:>8.3f} {slow[n]:>20.1%}")
    print(f"probe: {probe_ms:.3f} ms per step, {probe_ms / step_ms['recorder_probe']:.1%} of recorder_probe's step")
    print(json.dumps({"step_ms": {n: round(v, 4) for n, v in step_ms.items()},
                      "vs_bare": {n: round(step_ms[n] / step_ms["bare"], 4) for n in CANDIDATES},
                      "spread_q90_q10": {n: round(v, 4) for n, v in spread.items()},
                      "slow_step_share": {n: round(v, 4) for n, v in slow.items()},
                      "probe_ms": round(probe_ms, 4)}))


if __name__ == "__main__":
    main()
