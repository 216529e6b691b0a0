#!/usr/bin/env python3
"""The checkpointing what-if against reality: predicted step time and peak vs the same model
recorded with the named modules checkpointed.

For ``--model mlp`` (a stack of ``--blocks`` MLP blocks of ``--width``, batch ``--batch``) or
``--model gpt2`` (a small GPT2Config, nothing downloaded), one CPU thread, SGD: each repeat
records the plain model (``Recorder(counters="first")``: step 0 counted) and the model with
the modules ``--checkpoint`` names wrapped in non-reentrant ``torch.utils.checkpoint``, each for
``--steps`` steps, in turns (benchmarks/_common.py ``interleave``).  The plain run's
``Database.memory(checkpoint=...)`` gives the predicted step time (its median uncounted step
plus the checkpointed calls' forward time) and peak; the checkpointed run's median uncounted
step time (``Database.steps``) and ``step_memory`` peak are what happened.  Printed: per repeat
and as medians, predicted / measured for the step time and the peak; and the same step-time
ratio on the fastest steps (``floor_time_ratio``: the plain run's fastest uncounted step plus
the checkpointed modules' fastest forward, against the checkpointed run's fastest step), which
a loaded machine moves less than medians (load only adds time); and ``cpu_ratio``: the
predicted slowdown (predicted over measured step time of the plain run, both from its own
recording) over the slowdown in the program's CPU time per uncounted step (``time.thread_time``
around each step, checkpointed run over plain run), which other processes on the machine do
not move.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import modtrace  # noqa: E402
from benchmarks._common import interleave, load_average  # noqa: E402


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.fc2(nn.functional.gelu(self.fc1(x)))
        return out


class Stack(nn.Module):
    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def wrap(model: nn.Module, fqns: set[str]) -> nn.Module:
    """Each module named in ``fqns`` (modtrace's names) run under non-reentrant checkpointing."""
    root = type(model).__name__
    for name, module in model.named_modules():
        if (f"{root}.{name}" if name else root) in fqns:
            original = module.forward

            def forward(*a: Any, _original: Any = original, **k: Any) -> Any:
                return checkpoint(_original, *a, use_reentrant=False, **k)

            module.forward = forward  # type: ignore[method-assign]
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "gpt2"), default="mlp")
    parser.add_argument("--checkpoint", action="append", default=None, metavar="PATTERN",
                        help="module globs to checkpoint (default: every block)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.model == "mlp":
        patterns = args.checkpoint or ["blocks.*"]
        x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(1))

        def make() -> nn.Module:
            return Stack(args.width, args.blocks)

        def loss(model: nn.Module) -> torch.Tensor:
            return model(x).square().mean()
    else:
        import transformers

        patterns = args.checkpoint or ["transformer.h.*"]
        cfg = transformers.GPT2Config(vocab_size=512, n_positions=128, n_embd=128, n_layer=args.blocks, n_head=4,
                                      use_cache=False, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
        ids = torch.randint(0, 512, (8, 128), generator=torch.Generator().manual_seed(1))

        def make() -> nn.Module:
            model = transformers.GPT2LMHeadModel(cfg)
            model.train()
            return model

        def loss(model: nn.Module) -> torch.Tensor:
            out: torch.Tensor = model(input_ids=ids, labels=ids).loss
            return out

    tmp = Path(tempfile.mkdtemp(prefix="modtrace-bench-what-if-"))
    db = str(tmp / "what_if.db")
    count = {"plain": 0, "checkpointed": 0}
    fqns: set[str] = set()
    cpu: dict[str, float] = {}

    def record(kind: str) -> str:
        count[kind] += 1
        run = f"{kind}-{count[kind]}"
        torch.manual_seed(0)
        model = wrap(make(), fqns if kind == "checkpointed" else set())
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        spent = []
        with modtrace.Recorder(db=db, run=run, counters="first") as rec:
            for _ in range(args.steps):
                t0 = time.thread_time()
                loss(model).backward()
                opt.step()
                opt.zero_grad()
                spent.append(time.thread_time() - t0)
        rec.wait_analyzed()
        cpu[run] = statistics.median(spent[1:])  # step 0 is counted
        return run

    # The modules the patterns name, from one plain recording (not timed).
    first = record("plain")
    with modtrace.open(db) as database:
        found = database.memory(first, checkpoint=patterns).what_if
    assert found is not None
    fqns.update(found.modules)

    pairs: dict[str, list[str]] = {"plain": [], "checkpointed": []}
    interleave({k: (lambda k=k: pairs[k].append(record(k))) for k in pairs}, args.repeats)
    rows = []

    def uncounted(database: Any, run: str) -> list[int]:
        steps = database.steps(run)
        return [int(v) for v in steps.filter(steps["step"] > 0)["step_ns"].to_list()]

    def forward_sums(database: Any, run: str) -> list[int]:
        import polars as pl

        spans = database.spans(run)
        chosen = spans.filter((pl.col("phase").cast(pl.String) == "forward") & (pl.col("step") > 0)
                              & pl.col("fqn").cast(pl.String).is_in(sorted(fqns)))
        return [int(v) for v in chosen.group_by("step").agg(pl.col("duration_ns").sum())["duration_ns"].to_list()]

    with modtrace.open(db) as database:
        for plain, ckpt in zip(pairs["plain"], pairs["checkpointed"], strict=True):
            w = database.memory(plain, checkpoint=patterns).what_if
            assert w is not None
            measured_ns = statistics.median(uncounted(database, ckpt))
            floor_predicted = min(uncounted(database, plain)) + min(forward_sums(database, plain))
            floor_ratio = floor_predicted / min(uncounted(database, ckpt))
            peak = max(s.peak_bytes for s in database.memory(ckpt).steps)
            cpu_ratio = (w.step_ns / w.measured_step_ns) / (cpu[ckpt] / cpu[plain])
            rows.append({"cpu_ratio": cpu_ratio, "floor_time_ratio": floor_ratio, "plain_step_ms": w.measured_step_ns / 1e6, "added_ms": w.added_ns / 1e6,
                         "predicted_step_ms": w.step_ns / 1e6, "measured_step_ms": measured_ns / 1e6,
                         "time_ratio": w.step_ns / measured_ns, "predicted_peak": w.peak_bytes,
                         "measured_peak": peak, "peak_ratio": w.peak_bytes / peak})
    print(json.dumps({
        "model": args.model, "checkpoint": patterns, "modules": sorted(fqns), "steps": args.steps,
        "repeats": args.repeats, "load_average": load_average(), "rows": rows,
        "median_time_ratio": statistics.median(r["time_ratio"] for r in rows),
        "median_peak_ratio": statistics.median(r["peak_ratio"] for r in rows),
        "median_floor_time_ratio": statistics.median(r["floor_time_ratio"] for r in rows),
        "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in rows),
    }))


if __name__ == "__main__":
    main()
