#!/usr/bin/env python3
"""The prepared GPU check of device time and memory (issue 16, point 5).

Runs in under 5 minutes on one CUDA GPU and prints a machine-readable JSON
summary on its last line:

(a) ``matmul_vs_profiler``: on a model of large matmuls, each module's
    forward device time (spans.device_duration_ns, summed over the steps) is
    within 20% of the kernel time torch.profiler attributes to the same
    module's ops in the same steps (a record_function range per module);
(b) ``side_stream``: a module run under ``torch.cuda.stream(s)`` carries s's
    handle in event_log.stream, and device times on it;
(c) ``memory_delta``: a module that allocates a known tensor shows exactly
    that many bytes in spans.mem_delta_bytes, and torch's peak memory
    statistics are not reset by the recording;
(d) ``host_cost``: the added host time per module call with device time on,
    off, and with torch's ModuleTracker (interleaved repeats, medians), and
    the per-call cost of the CUDA calls themselves;
(e) ``check_clean``: ``modtrace check`` finds no error or warning on a real
    recording with backward and activation checkpointing, whose backward and
    recompute spans have device times;
(f) ``compiled_on_cuda``: a model compiled whole by inductor on the GPU,
    trained under a recorder while torch.profiler records CUDA kernels: no
    error or warning, every compiled call and every inner-module span
    attributed from its kernels has device times (events recorded either
    side of each kernel launch), and the Linear layers' attributed device
    self time is within 20% of the profiler's GEMM kernel time in the same
    steps;
(g) ``step_peak``: with memory counted on every step (``Recorder(counters="every-step")``),
    each step's peak in ``step_memory`` (the CUDA device's) is within 10% of
    ``torch.cuda.max_memory_allocated`` with the peak statistics reset at the step's start;
(h) ``kept_vs_memtracker``: each module's forward ``kept_mem_bytes`` on the counted step
    is within 5% of torch's ``MemTracker`` (post-forward minus pre-forward total) for
    the same model and input on CUDA, run beside it (issue 41, point 6).

It is written against the phase-2 API (``Recorder(device_time=...)``,
``event_log.device_ts_ns``/``mem_bytes``, the spans' device columns,
``modtrace record --no-device-time``).  Whatever of it this build lacks is
listed under ``phase2_api`` and fails the checks that need it, each with a
one-line reason; no check is skipped silently.  Without CUDA it says
``"skipped": "no CUDA"`` and exits 0 (nothing was checked); on a GPU it exits
0 when every check passed, else 1.

Usage: scripts/gpu_check.py [--db-dir DIR]
"""

from __future__ import annotations

import argparse
import inspect
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import modtrace  # noqa: E402
from modtrace.store.engine import open_store  # noqa: E402

EVENT_LOG_COLUMNS = ("device_ts_ns", "mem_bytes")
MEMORY_SPAN_COLUMNS = ("kept_mem_bytes", "peak_mem_bytes")
SPAN_COLUMNS = ("device_start_ns", "device_end_ns", "device_duration_ns", "device_self_ns", "mem_delta_bytes",
                "mem_max_bytes")


class Missing(Exception):
    """A part of the phase-2 API this build does not have."""


# -- what this build offers --------------------------------------------------------


def phase2_api(db_dir: Path) -> dict[str, bool]:
    found: dict[str, bool] = {}
    found["Recorder(device_time=)"] = "device_time" in inspect.signature(modtrace.Recorder).parameters
    db = db_dir / "schema.db"
    store = open_store(str(db), create=True)
    store.dispose()
    with sqlite3.connect(db) as conn:
        for rel, cols in (("event_log", EVENT_LOG_COLUMNS), ("spans", SPAN_COLUMNS)):
            live = {r[1] for r in conn.execute(f"PRAGMA table_info({rel})")}
            for c in cols:
                found[f"{rel}.{c}"] = c in live
        spans = {r[1] for r in conn.execute("PRAGMA table_info(spans)")}
        for c in MEMORY_SPAN_COLUMNS:
            found[f"spans.{c}"] = c in spans
        found["step_memory"] = bool(conn.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'step_memory'").fetchone())
    for command, option in (("record", "--no-device-time"), ("tree", "--clock")):
        out = subprocess.run([sys.executable, "-m", "modtrace", command, "--help"], capture_output=True, text=True,
                             cwd=ROOT, timeout=60)
        found[f"modtrace {command} {option}"] = option in out.stdout
    return found


API: dict[str, bool] = {}


def need(*parts: str) -> None:
    missing = [p for p in parts if not API.get(p)]
    if missing:
        raise Missing(f"this build has no {', '.join(missing)} (phase 2 of issue 16 not wired)")


@contextmanager
def recording(db: Path, run: str, device_time: bool | None = True) -> Iterator[Any]:
    kwargs: dict[str, Any] = {}
    if device_time is not None:
        need("Recorder(device_time=)")
        kwargs["device_time"] = device_time
    with modtrace.Recorder(db=str(db), run=run, **kwargs) as rec:
        yield rec
        torch.cuda.synchronize()


def query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def run_id(db: Path, run: str) -> int:
    return int(query(db, "SELECT id FROM runs WHERE name = ?", run)[0][0])


# -- the checks --------------------------------------------------------------------


class MatmulNet(nn.Module):
    def __init__(self, n: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(n, n, bias=False) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def check_a(db: Path, dev: torch.device) -> dict[str, Any]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    need("Recorder(device_time=)", "spans.device_duration_ns")
    n, steps = 8192, 5
    net = MatmulNet(n, 4).to(dev, torch.bfloat16)
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    ranges: dict[int, Any] = {}
    names = {id(m): f"gpu_check::{name or 'root'}" for name, m in net.named_modules()}

    def pre(mod: nn.Module, args: Any) -> None:
        ranges[id(mod)] = record_function(names[id(mod)]).__enter__()

    def post(mod: nn.Module, args: Any, out: Any) -> None:
        ranges.pop(id(mod)).__exit__(None, None, None)

    handles = [h for m in net.modules() for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    with torch.no_grad():
        for _ in range(2):
            net(x)  # warm: cuBLAS handles and kernels chosen
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with recording(db, "a") as rec:  # the same steps seen by both
                for _ in range(steps):
                    net(x)
                    rec.step()
    for h in handles:
        h.remove()
    kernel_ns: dict[str, float] = {}
    for e in prof.events():
        if e.name.startswith("gpu_check::") and e.device_type == DeviceType.CPU:
            key = e.name.removeprefix("gpu_check::")
            kernel_ns[key] = kernel_ns.get(key, 0.0) + e.device_time_total * 1000.0
    rows = query(db, "SELECT fqn, SUM(device_duration_ns), COUNT(*), COUNT(device_duration_ns) FROM spans "
                 "WHERE run_id = ? AND phase = 'forward' GROUP BY fqn", run_id(db, "a"))
    modules = {}
    for fqn, device_ns, calls, timed in rows:
        key = fqn.split(".", 1)[1] if "." in fqn else "root"
        ratio = (device_ns or 0) / kernel_ns[key] if kernel_ns.get(key) else None
        modules[fqn] = {"calls": calls, "timed": timed, "device_ms": (device_ns or 0) / 1e6,
                        "profiler_kernel_ms": kernel_ns.get(key, 0.0) / 1e6, "ratio": ratio}
    ok = bool(modules) and all(m["ratio"] is not None and 0.8 <= m["ratio"] <= 1.2 and m["timed"] == m["calls"]
                               for m in modules.values())
    return {"ok": ok, "steps": steps, "modules": modules}


def check_b(db: Path, dev: torch.device) -> dict[str, Any]:
    need("Recorder(device_time=)", "event_log.device_ts_ns", "spans.device_duration_ns")
    lin = nn.Linear(4096, 4096, device=dev)
    x = torch.randn(4096, 4096, device=dev)
    side = torch.cuda.Stream(dev)
    with recording(db, "b") as rec:
        for _ in range(3):
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                lin(x)
            torch.cuda.current_stream(dev).wait_stream(side)
            rec.step()
    rid = run_id(db, "b")
    events = query(db, "SELECT stream, device_ts_ns FROM event_log WHERE run_id = ? AND fqn = 'Linear'", rid)
    spans = query(db, "SELECT stream, device_duration_ns FROM spans WHERE run_id = ? AND fqn = 'Linear'", rid)
    want = side.cuda_stream
    ok = (len(events) == 6 and all(s == want and ts is not None for s, ts in events)
          and len(spans) == 3 and all(s == want and d is not None and d > 0 for s, d in spans))
    return {"ok": ok, "side_stream": want, "events": events, "spans": spans}


class Alloc(nn.Module):
    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.nbytes = nbytes
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept.append(torch.empty(self.nbytes, dtype=torch.uint8, device=x.device))
        return x


def check_c(db: Path, dev: torch.device) -> dict[str, Any]:
    need("Recorder(device_time=)", "spans.mem_delta_bytes", "spans.mem_max_bytes", "event_log.mem_bytes")
    nbytes = 64 << 20
    mod = Alloc(nbytes)
    x = torch.ones(8, device=dev)
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)  # a peak before the recording
    del big
    peak_before = torch.cuda.max_memory_allocated(dev)
    with recording(db, "c") as rec:
        for _ in range(3):
            mod(x)
            rec.step()
    spans = query(db, "SELECT mem_delta_bytes, mem_max_bytes FROM spans WHERE run_id = ? AND fqn = 'Alloc' "
                  "ORDER BY span_id", run_id(db, "c"))
    peak_kept = torch.cuda.max_memory_allocated(dev) >= peak_before  # torch's peak statistics never reset
    ok = len(spans) == 3 and all(delta == nbytes for delta, _ in spans) and peak_kept
    return {"ok": ok, "expected_bytes": nbytes, "spans": spans, "peak_stats_kept": peak_kept}


def _per_call_us(fn: Callable[[], Any], n: int = 20_000) -> float:
    for _ in range(100):
        fn()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1000


def cuda_call_costs(dev: torch.device) -> dict[str, float]:
    """Host microseconds per call of what device timing does per event."""
    from modtrace.tracking.device_timer import CudaClock, DeviceTimer

    stream = torch.cuda.current_stream(dev)
    ev = torch.cuda.Event(enable_timing=True)
    ev.record(stream)
    torch.cuda.synchronize()
    clock = CudaClock()
    timer = DeviceTimer(clock, lambda: 0)
    seq = iter(range(10**9))
    handle = stream.cuda_stream
    costs = {
        "current_stream": _per_call_us(lambda: torch.cuda.current_stream(dev)),
        "event_record": _per_call_us(lambda: ev.record(stream)),
        "event_query": _per_call_us(ev.query),
        "is_current_stream_capturing": _per_call_us(torch.cuda.is_current_stream_capturing),
        "memory_allocated": _per_call_us(lambda: torch.cuda.memory_allocated(dev)),
        "memory_nested_stats": _per_call_us(lambda: clock.memory_allocated(dev.index)),
        "timer_mark": _per_call_us(lambda: timer.mark(next(seq), dev.index, stream, handle)),
    }
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    rows = timer.poll()
    costs["timer_poll_per_event"] = (time.perf_counter_ns() - t0) / max(len(rows), 1) / 1000
    timer.drain()
    return costs


def check_d(db: Path, dev: torch.device) -> dict[str, Any]:
    from torch.utils.module_tracker import ModuleTracker

    result: dict[str, Any] = {"cuda_calls_us": cuda_call_costs(dev)}
    need("Recorder(device_time=)")
    width, depth, steps, repeats = 256, 100, 10, 5
    net = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)]).to(dev)
    x = torch.randn(8, width, device=dev)
    calls = depth + 1

    def train(k: int) -> None:
        for _ in range(k):
            net(x).sum().backward()

    @contextmanager
    def mode(name: str, i: int) -> Iterator[Any]:
        if name == "bare":
            yield None
        elif name == "module_tracker":
            with ModuleTracker():
                yield None
        else:
            with modtrace.Recorder(db=str(db), run=f"d-{name}-{i}", device_time=name == "device_on",
                                   analyze=False) as rec:
                yield rec

    times: dict[str, list[float]] = {m: [] for m in ("bare", "module_tracker", "device_off", "device_on")}
    names = list(times)
    for i in range(repeats):
        for name in names[i % 4:] + names[:i % 4]:
            with mode(name, i):
                train(2)  # warm, untimed
                torch.cuda.synchronize()
                t0 = time.perf_counter_ns()
                train(steps)
                torch.cuda.synchronize()
                times[name].append((time.perf_counter_ns() - t0) / steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    result["step_ms"] = {k: v / 1e6 for k, v in med.items()}
    result["added_us_per_module_call"] = {k: (med[k] - med["bare"]) / calls / 1000 for k in names[1:]}
    result["device_time_added_us_per_call"] = (med["device_on"] - med["device_off"]) / calls / 1000
    # A measurement, judged by the reader against ModuleTracker's figure; it
    # fails only when a figure could not be taken.
    result["ok"] = all(v == v and v != float("inf") for v in med.values())
    return result


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class CheckpointNet(nn.Module):
    def __init__(self, width: int = 1024, blocks: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        for i, blk in enumerate(self.blocks):
            x = checkpoint(blk, x, use_reentrant=False) if i % 2 else blk(x)
        return x


def check_e(db: Path, dev: torch.device) -> dict[str, Any]:
    net = CheckpointNet().to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device=dev)
    device_time = True if API.get("Recorder(device_time=)") else None
    with recording(db, "e", device_time=device_time):
        for _ in range(4):
            net(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    out = subprocess.run([sys.executable, "-m", "modtrace", "check", "e", "--db", str(db), "--format", "json"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    issues = json.loads(out.stdout) if out.stdout.strip().startswith(("[", "{")) else out.stdout
    bad = [i for i in issues if isinstance(i, dict) and i.get("severity") in ("error", "warning")] \
        if isinstance(issues, list) else issues
    result: dict[str, Any] = {"check_rc": out.returncode, "errors_or_warnings": bad, "stderr": out.stderr[-500:]}
    phases = query(db, "SELECT phase, COUNT(*) FROM spans WHERE run_id = ? GROUP BY phase", run_id(db, "e"))
    result["spans"] = dict(phases)
    clean = out.returncode == 0 and not bad and {"forward", "backward", "recompute"} <= set(result["spans"])
    result["check_clean"] = clean
    try:
        need("Recorder(device_time=)", "spans.device_duration_ns")  # the check above ran; now the device side
    except Missing as exc:
        return result | {"ok": False, "error": f"missing: {exc}"}
    timed = query(db, "SELECT phase, COUNT(*), COUNT(device_duration_ns) FROM spans WHERE run_id = ? "
                  "GROUP BY phase", run_id(db, "e"))
    result["timed"] = {p: {"spans": n, "with_device_time": t} for p, n, t in timed}
    result["ok"] = clean and all(n == t for _, n, t in timed)
    return result


GEMM_KERNEL = ("gemm", "xmma", "cutlass", "nvjet", "gemv")  # cuBLAS/cuBLASLt kernel names


def check_f(db: Path, dev: torch.device) -> dict[str, Any]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(1024, 4096)
            self.proj = nn.Linear(4096, 1024)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = x + self.proj(torch.nn.functional.gelu(self.fc(x)))
            return out

    steps = 4
    net = nn.Sequential(*[Block() for _ in range(4)]).to(dev)
    compiled = torch.compile(net)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    x = torch.randn(2048, 1024, device=dev)  # matmuls of 8.6 GFLOP: launch gaps small beside them
    for _ in range(2):
        compiled(x).sum().backward()  # compile and warm outside the recording
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with recording(db, "f"):  # the same steps seen by both
            for _ in range(steps):
                compiled(x).sum().backward()
                opt.step()
                opt.zero_grad()
    gemm_ns = sum(e.device_time_total * 1000.0 for e in prof.events()
                  if e.device_type == DeviceType.CUDA and any(k in e.name.lower() for k in GEMM_KERNEL))
    rid = run_id(db, "f")
    issues = query(db, "SELECT severity, kind FROM nesting_issues WHERE run_id = ? AND severity != 'info'", rid)
    roots = query(db, "SELECT phase, COUNT(*), COUNT(device_duration_ns) FROM spans WHERE run_id = ? AND depth = 0 "
                  "GROUP BY phase", rid)
    inner = query(db, "SELECT fqn, phase, COUNT(*), COUNT(device_duration_ns), SUM(device_self_ns) FROM spans "
                  "WHERE run_id = ? AND status = 'attributed' GROUP BY fqn, phase ORDER BY fqn, phase", rid)
    # The Linear layers' kernels are the GEMMs (forward addmm, backward two mm each) and
    # the bias gradient's small reduction: their attributed device time against the
    # profiler's GEMM kernel time in the same steps.
    linear_ns = sum(ns or 0 for fqn, _phase, _n, _t, ns in inner if fqn.endswith((".fc", ".proj")))
    ratio = linear_ns / gemm_ns if gemm_ns else None
    ok = (not issues and bool(roots) and all(timed == calls for _phase, calls, timed in roots)
          and bool(inner) and all(n == t for _f, _p, n, t, _ns in inner)
          and ratio is not None and 0.8 <= ratio <= 1.2)
    return {"ok": ok, "issues": issues, "roots": roots, "steps": steps,
            "attributed": {f"{fqn} {phase}": {"spans": n, "timed": t, "device_self_ms": (ns or 0) / 1e6}
                           for fqn, phase, n, t, ns in inner},
            "linear_attributed_device_ms": linear_ns / 1e6, "profiler_gemm_kernel_ms": gemm_ns / 1e6,
            "ratio": ratio}


class MemBlock(nn.Module):
    """Linear, GELU, Linear: its forward keeps the GELU's input and output for the backward."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(torch.nn.functional.gelu(self.fc(x)))
        return out


def mem_net(dev: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[MemBlock(1024) for _ in range(4)]).to(dev)


def check_g(db: Path, dev: torch.device) -> dict[str, Any]:
    need("step_memory")
    net = mem_net(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    x = torch.randn(4096, 1024, device=dev)  # tensors of 16 MiB and more: the allocator's rounding is noise
    torch_peaks = []
    with modtrace.Recorder(db=str(db), run="g", counters="every-step") as rec:
        for _ in range(3):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
            net(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            torch_peaks.append(torch.cuda.max_memory_allocated(dev))
    rec.wait_analyzed()
    rows = query(db, "SELECT step, device, peak_bytes FROM step_memory WHERE run_id = ? ORDER BY step", run_id(db, "g"))
    ours = [int(peak) for _step, device, peak in rows if "cuda" in str(device)]
    ratios = [o / t for o, t in zip(ours, torch_peaks, strict=False)]
    ok = len(ours) == len(torch_peaks) and all(0.9 <= r <= 1.1 for r in ratios)
    return {"ok": ok, "step_memory": rows, "max_memory_allocated": torch_peaks, "ratios": ratios}


def check_h(db: Path, dev: torch.device) -> dict[str, Any]:
    need("spans.kept_mem_bytes")
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState

    x = torch.randn(4096, 1024, device=dev)
    net = mem_net(dev)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    tracker = MemTracker()
    tracker.track_external(net, opt, x)
    with tracker:
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    theirs: dict[str, int] = {}
    for module, stats in tracker.memory_tracking.items():
        if not isinstance(module, nn.Module):
            continue
        pre, post = stats.snapshots.get(_ModState.PRE_FW, []), stats.snapshots.get(_ModState.POST_FW, [])
        if pre and post:
            theirs[stats.mod_fqn] = post[0].get(dev, {}).get("Total", 0) - pre[0].get(dev, {}).get("Total", 0)
    del net, opt
    net = mem_net(dev)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    with modtrace.Recorder(db=str(db), run="h", counters="first") as rec:
        net(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    rec.wait_analyzed()
    rows = query(db, "SELECT fqn, kept_mem_bytes FROM spans WHERE run_id = ? AND phase = 'forward' "
                 "AND kept_mem_bytes IS NOT NULL AND device LIKE 'cuda%'", run_id(db, "h"))
    ours = {str(fqn): int(kept) for fqn, kept in rows}
    # MemTracker names modules from the root's class (Sequential.0), modtrace likewise.
    pairs = {name: (ours.get(name), kept) for name, kept in theirs.items() if kept > 0}
    ratios = {name: (o / t if o is not None else None) for name, (o, t) in pairs.items()}
    ok = bool(ratios) and all(r is not None and 0.95 <= r <= 1.05 for r in ratios.values())
    return {"ok": ok, "memtracker_kept": theirs, "modtrace_kept": ours, "ratios": ratios}


CHECKS = {"a_matmul_vs_profiler": check_a, "b_side_stream": check_b, "c_memory_delta": check_c,
          "d_host_cost": check_d, "e_check_clean": check_e, "f_compiled_on_cuda": check_f,
          "g_step_peak": check_g, "h_kept_vs_memtracker": check_h}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db-dir", type=Path, default=None, help="where the databases go (default: a temp dir)")
    args = ap.parse_args()
    started = time.monotonic()
    summary: dict[str, Any] = {"script": "gpu_check", "torch": torch.__version__, "cuda": torch.cuda.is_available()}
    with tempfile.TemporaryDirectory(prefix="modtrace-gpu-check-") as tmp:
        db_dir = args.db_dir or Path(tmp)
        db_dir.mkdir(parents=True, exist_ok=True)
        API.update(phase2_api(db_dir))
        summary["phase2_api"] = API
        if not summary["cuda"]:
            summary["skipped"] = "no CUDA"
            print(json.dumps(summary))
            return 0
        dev = torch.device("cuda", torch.cuda.current_device())
        summary["device"] = torch.cuda.get_device_name(dev)
        checks: dict[str, Any] = {}
        for name, fn in CHECKS.items():
            t0 = time.monotonic()
            db = db_dir / f"{name}.db"
            try:
                checks[name] = fn(db, dev)
            except Missing as exc:
                checks[name] = {"ok": False, "error": f"missing: {exc}"}
            except Exception as exc:
                checks[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                "where": traceback.format_exc().strip().splitlines()[-3:]}
            checks[name]["seconds"] = round(time.monotonic() - t0, 1)
            print(f"gpu_check: {name}: {'ok' if checks[name]['ok'] else 'FAILED'} ({checks[name]['seconds']} s)",
                  file=sys.stderr, flush=True)
        summary["checks"] = checks
        summary["ok"] = all(c["ok"] for c in checks.values())
        summary["seconds"] = round(time.monotonic() - started, 1)
        print(json.dumps(summary, default=str))
        return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
