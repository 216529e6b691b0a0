"""A container's own time against a block's, run to run, on the wall and the thread's CPU clock.

    .venv/bin/python benchmarks/module_clocks.py [--runs 12] [--steps 20] [--loads 0,2]

Why the gate's module rule blames a root container now and then on a loaded
machine, and what would not cure it.  The gate's model (``_common.gate_model``)
runs its forward (no autograd) under global forward hooks of this script's
own that read both clocks at each module's entry and exit; no recorder.
Per run, the 10th percentile over its steps (the level the gate judges) of
the own time of the root ``Sequential`` (its loop and the module call
machinery: interpreter code) and of block 0 (matmuls), on either clock; and
the median of two probes timed before each step: modtrace's speed probe
(``SpeedProbe``: matmul layers forward and backward) and a loop of small
Python method calls (the interpreter's speed alone).

Prints per load (busy processes beside it) each level across the runs with
its max / min, then how the root's own time over the block's (log, CPU
clock) moves from run to run, and whether the Python loop's speed over the
probe's follows it (their correlation, and the spread left after dividing
one by the other).  A move of the root against the block on the CPU clock
too means the neighbour slows interpreter code more than matmuls while the
thread runs, which per-module CPU time would not remove; a correlation near
1 would let a second probe tell such a move from a change.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._common import busy_processes, gate_model, python_loop_probe  # noqa: E402

QUANTILE = 0.10  # the gate's level: the low quantile of a module's time per step


def level(values: list[int]) -> float:
    return float(sorted(values)[int(len(values) * QUANTILE)])


def correlation(a: list[float], b: list[float]) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    num = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    den = math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))
    return num / den if den else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--loads", default="0,2", help="busy processes beside the runs, comma-separated")
    args = p.parse_args()
    import torch
    from torch import nn

    from modtrace.recording.speed_probe import SpeedProbe

    torch.set_num_threads(1)
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    events: list[tuple[int, int, int, int]] = []  # (0 enter | 1 exit, id(module), wall, cpu)
    nn.modules.module.register_module_forward_pre_hook(lambda m, a: events.append((0, id(m), wall(), cpu())))
    nn.modules.module.register_module_forward_hook(lambda m, a, o: events.append((1, id(m), wall(), cpu())))
    probe = SpeedProbe(wall, cpu=False)

    python_loop = python_loop_probe(wall)

    def one_run() -> dict[str, float]:
        model = gate_model()
        x = torch.randn(32, 128)
        seen: dict[str, list[int]] = {k: [] for k in ("root_wall", "root_cpu", "block_wall", "block_cpu", "probe", "python")}
        for s in range(args.steps + 2):
            probe.take(0, 0)
            took_probe = probe.rows.pop()[3]
            took_python = python_loop()
            events.clear()
            with torch.no_grad():
                model(x)
            own: dict[int, list[int]] = {}
            stack: list[list[int]] = []  # [id, wall0, cpu0, children's wall, children's cpu]
            for kind, mid, w, c in events:
                if kind == 0:
                    stack.append([mid, w, c, 0, 0])
                    continue
                m, w0, c0, cw, cc = stack.pop()
                mine = own.setdefault(m, [0, 0])
                mine[0] += w - w0 - cw
                mine[1] += c - c0 - cc
                if stack:
                    stack[-1][3] += w - w0
                    stack[-1][4] += c - c0
            if s >= 2:
                root, block = own[id(model)], own[id(model[0])]
                for key, v in (("root_wall", root[0]), ("root_cpu", root[1]), ("block_wall", block[0]),
                               ("block_cpu", block[1]), ("probe", took_probe), ("python", took_python)):
                    seen[key].append(v)
        out = {k: level(v) for k, v in seen.items() if k.startswith(("root", "block"))}
        out.update({k: float(statistics.median(seen[k])) for k in ("probe", "python")})
        return out

    result: dict[str, Any] = {}
    print(f"runs {args.runs}, steps {args.steps}, one thread; levels in us (10th percentile of own time per step)")
    for load in (int(v) for v in args.loads.split(",") if v):
        spinners = busy_processes(load)
        try:
            time.sleep(1)
            runs = [one_run() for _ in range(args.runs)]
        finally:
            for s in spinners:
                s.kill()
                s.wait()
        for key in runs[0]:
            values = [r[key] / 1000 for r in runs]
            print(f"{load} {key:<10} " + " ".join(f"{v:7.1f}" for v in values) + f"  max/min {max(values) / min(values):.2f}")
        rel = [math.log(r["root_cpu"] / r["block_cpu"]) for r in runs]
        speeds = [math.log(r["python"] / r["probe"]) for r in runs]
        corr = correlation(rel, speeds)
        left = statistics.pstdev([a - b for a, b in zip(rel, speeds, strict=True)])
        print(f"{load} root/block (CPU clock): sd of log {statistics.pstdev(rel):.3f}; correlation with "
              f"log(python loop / probe) {corr:.2f}; sd of log after dividing by it {left:.3f}")
        result[str(load)] = {"sd_log_root_over_block": round(statistics.pstdev(rel), 4),
                             "correlation_with_python_over_probe": round(corr, 3), "sd_log_left": round(left, 4)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
