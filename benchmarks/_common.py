"""What the benchmarks share: timing, medians of interleaved repeats, the load average, CPU
time, and the synthetic models and recordings several of them time.

Each benchmark is a script (``python benchmarks/bench_NAME.py --help``); none imports
another.  They reach modtrace through its public API where it has one
(``modtrace.Recorder``, ``modtrace.open``, the ``modtrace`` command) and through module
paths, never underscore names, where a benchmark times one stage alone (the tracker, the
event writer, ``write_analysis``).

Heavy imports (polars, numpy, torch, modtrace's store) happen inside the functions that
need them, so a benchmark that only runs the CLI does not pay for them.
"""

from __future__ import annotations

import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import polars as pl
    from torch import nn

REPO = Path(__file__).resolve().parent.parent

Clock = Callable[[], float]
T = TypeVar("T")


# ------------------------------------------------------------------- the machine


def load_average() -> list[float]:
    """The machine's load average (1, 5 and 15 minutes), rounded: printed beside the figures,
    since on a shared machine a time means little without it."""
    return [round(x, 2) for x in os.getloadavg()]


def children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's children that have been waited for."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def process_cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds of another process (the recorder's writer process), or None: the
    scheduler's count in nanoseconds where the kernel keeps one (/proc/PID/schedstat), else
    user + system time in clock ticks (10 ms: sum it over many steps)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


# ------------------------------------------------------------------------ timing


def timed(fn: Callable[[], T], clock: Clock = time.perf_counter) -> tuple[float, T]:
    """(seconds ``fn`` took on ``clock``, what it returned)."""
    t0 = clock()
    out = fn()
    return clock() - t0, out


def timed_cpu(fn: Callable[[], T], clock: Clock = time.perf_counter,
              cpu_clock: Clock = time.process_time) -> tuple[float, float, T]:
    """(wall seconds, this process's CPU seconds, what ``fn`` returned)."""
    t0, c0 = clock(), cpu_clock()
    out = fn()
    return clock() - t0, cpu_clock() - c0, out


@dataclass
class Samples:
    """The times of interleaved repeats, per candidate: ``wall`` on the wall clock,
    ``cpu`` this process's CPU time over the same calls."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def medians(self, cpu: bool = False) -> dict[str, float]:
        return medians(self.cpu if cpu else self.wall)

    def ratio(self, name: str, baseline: str, cpu: bool = False) -> float:
        """Median of ``name`` over median of ``baseline``."""
        m = self.medians(cpu)
        return m[name] / m[baseline]

    def paired_differences(self, name: str, baseline: str, cpu: bool = False) -> list[float]:
        """``name`` minus ``baseline``, repeat by repeat (each pair ran back to back)."""
        s = self.cpu if cpu else self.wall
        return [a - b for a, b in zip(s[name], s[baseline], strict=True)]


def interleave(
    candidates: Mapping[str, Callable[[], object]],
    repeats: int,
    *,
    clock: Clock = time.perf_counter,
    cpu_clock: Clock = time.process_time,
    rng: random.Random | None = None,
    before: Callable[[str], object] | None = None,
    after: Callable[[str, Any], object] | None = None,
    own_time: Collection[str] = (),
) -> Samples:
    """Run every candidate once per repeat, taking turns, and time each call.

    Repeat r starts with candidate r (modulo their number) and goes on in order, so none
    always runs first or right after the same other; with ``rng`` each repeat's order is
    shuffled instead.  A change of the machine's load between repeats then falls on every
    candidate alike, which is why their medians, and ratios of medians, compare where
    single runs do not.  ``before(name)`` and ``after(name, result)`` run around each call,
    off the clock (a set-up, a check of the result).  A candidate named in ``own_time``
    returns its own seconds (it timed itself, in a child process say); they are its wall
    sample."""
    names = list(candidates)
    out = Samples({n: [] for n in names}, {n: [] for n in names})
    for r in range(repeats):
        order = rng.sample(names, len(names)) if rng is not None else names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if before is not None:
                before(name)
            t0, c0 = clock(), cpu_clock()
            result = candidates[name]()
            t1, c1 = clock(), cpu_clock()
            out.wall[name].append(float(result) if name in own_time else t1 - t0)  # type: ignore[arg-type]
            out.cpu[name].append(c1 - c0)
            if after is not None:
                after(name, result)
    return out


def median(values: Iterable[float]) -> float:
    return statistics.median(values)


def medians(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in samples.items()}


def ratios(meds: Mapping[str, float], baseline: str) -> dict[str, float]:
    """Each median over ``baseline``'s (the baseline left out)."""
    return {k: v / meds[baseline] for k, v in meds.items() if k != baseline}


# ----------------------------------------------------------------- the CLI, a DB


def run_modtrace(args: Sequence[str], *, ok: Collection[int] = (0,), cwd: Path | str | None = None,
                 env: Mapping[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    """One ``modtrace`` command in a fresh interpreter, as a user runs it: its wall time and
    its result; a SystemExit naming it when its exit code is not in ``ok``.  ``env``: the
    child's environment (None: this process's)."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "modtrace", *args], capture_output=True, text=True, check=False,
                          cwd=cwd, env=None if env is None else dict(env))
    wall = time.perf_counter() - t0
    if done.returncode not in ok:
        raise SystemExit(f"modtrace {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, done


def schema_url(url: str, schema: str) -> str:
    """``url`` with ``schema`` first on its search path (a scratch schema of a PostgreSQL server)."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options=-csearch_path%3D{schema}"


def fresh_schema(url: str, schema: str) -> str:
    """Drop and create ``schema`` on the PostgreSQL server of ``url``; the URL that uses it."""
    import sqlalchemy as sa

    admin = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    admin.dispose()
    return schema_url(url, schema)


def drop_schema(url: str, schema: str) -> None:
    import sqlalchemy as sa

    admin = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    admin.dispose()


# --------------------------------------------------------------- synthetic data


def linear_relu_stack(blocks: int = 200) -> nn.Sequential:
    """``blocks`` x (Linear(16, 16) + ReLU): many cheap module calls, so the hooks' cost shows."""
    from torch import nn

    return nn.Sequential(*[m for _ in range(blocks) for m in (nn.Linear(16, 16), nn.ReLU())])


def event_rows(n: int) -> list[tuple[Any, ...]]:
    """``n`` event rows in the event writer's column order (``store.writer.EVENT_COLUMNS``:
    seq, ts_ns, kind, module_id, phase, call_id, step, thread_id, device_id, stream, status,
    graph_task, tie) of a 400-module forward and backward; for write and read paths, which
    do not care whether the calls nest."""
    return [
        (i, 1000 * i, i & 1, (i >> 1) % 400, (i // 802) & 1, i >> 1, i // 1604, 0, 0, None, 0,
         None if (i // 802) & 1 == 0 else 7, 0)
        for i in range(n)
    ]


BLOCKS, GROUPS, LEAVES = 12, 7, 6  # 1 + 12 * (1 + 7 * (1 + 6)) + 1 = 602 modules


def analysis_modules() -> tuple[pl.DataFrame, list[tuple[int, list[int]]]]:
    """The modules of the analysis benchmarks' model (a ~600-module net, 12 blocks of 50
    modules) as a modules frame, and its call tree as (module, children) for each module."""
    import polars as pl

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
    """One step's events as (kind, module, phase, tie, status); call id = module id.

    Forward, then backward with its hook dispatches tied as autograd fires them, the root
    and the first block's first group closed at the end of the graph task."""
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


def analysis_events(n_events: int, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(events, modules, devices) frames of about ``n_events`` events (whole steps of
    ``step_template`` over ``analysis_modules``), random gaps between timestamps."""
    import numpy as np
    import polars as pl

    mods, tree = analysis_modules()
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
            pl.Series(phase == 0), None),
        "tie": tiled[:, 3].astype(np.int8),
    })
    devices = pl.DataFrame({"rank": [0], "device_id": [0], "name": ["cpu"]})
    return events, mods, devices


def write_recording(url: str, n: int, name: str = "bench",
                    frames: tuple[pl.DataFrame, pl.DataFrame] | None = None) -> int:
    """A completed run ``name`` of about ``n`` events (``analysis_events``' shape, or the
    (events, modules) ``frames`` given), not analysed, written by the recorder's event writer
    into ``url`` (created when missing); its run id."""
    from modtrace.core.contracts import Batch
    from modtrace.store.engine import open_store
    from modtrace.store.runs import add_rank, create_run, finish_rank
    from modtrace.store.writer import EVENT_COLUMNS, RankWriter

    events, mods = frames if frames is not None else analysis_events(n)[:2]
    store = open_store(url, create=True)
    try:
        run_id, _ = create_run(store, name, {})
        add_rank(store, run_id, 0, 0)
        writer = RankWriter(store, run_id, 0)
        writer.write(Batch([], modules=mods.drop("rank").rows(), threads=[(0, 1, "MainThread")], devices=[(0, "cpu")]))
        for start in range(0, events.height, 250_000):
            part = events.slice(start, 250_000)
            # steps only grow along seq: the part's last step is its largest
            writer.write(Batch(part.select(EVENT_COLUMNS).rows(), progress=(start + part.height, int(part.item(-1, "step")) + 1)))
        finish_rank(store, run_id, 0, "completed")
    finally:
        store.dispose()
    return run_id


if __name__ == "__main__":  # a recording for benchmarks that time an existing one (bench_stored_tree)
    import argparse

    ap = argparse.ArgumentParser(description="Write a synthetic recording (run 'bench') for the benchmarks.")
    ap.add_argument("db", help="a SQLite file or a database URL")
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    print(write_recording(args.db, args.events))


def gate_model(blocks: int = 4, width: int = 128, reps: Callable[[int], int] = lambda i: 10) -> nn.Sequential:
    """The regression gate's small model (``gate_power.py``, ``bench_speed_probe.py``): ``blocks``
    blocks, block i applying its Linear ``reps(i)`` times (its own code: the weights applied
    directly, each application followed by tanh), with a residual."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, reps: int) -> None:
            super().__init__()
            self.lin = nn.Linear(width, width)
            self.reps = reps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x
            for _ in range(self.reps):
                y = torch.tanh(torch.nn.functional.linear(y, self.lin.weight, self.lin.bias))
            return x + y

    torch.manual_seed(0)
    return nn.Sequential(*(Block(reps(i)) for i in range(blocks)))


def busy_processes(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes that do nothing but spin: a neighbour's load (kill and wait for them)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
