#!/usr/bin/env python3
"""Host cost of device timing per event, on the CPU (issue 16).

What one enter or exit costs the program with device time on, apart from the
CUDA calls themselves (which need a GPU: scripts/gpu_check.py point (d)):

* ``mark_null``: ``DeviceTimer.mark`` over a clock whose record, query and
  memory calls do nothing -- modtrace's own code on the hot path; beside
  ``call_noop``, a call of a no-op function with the same arguments (the
  least any hook call costs; the ratio travels between machines);
* ``mark_fake``: the same over the test device clock (tests/helpers/device_clock.py),
  which does a little bookkeeping per record;
* ``poll_null``: ``DeviceTimer.poll`` per event resolved (at step boundaries,
  off the modules' time);
* ``tracker_plain`` / ``tracker_device``: a Tracker recording forward +
  backward of 200 x (Linear(16,16) + ReLU), step time per event, appending
  to a list; without device time (the CPU path: what every CPU run does),
  and with the null clock injected as the device clock, so every event
  takes the tracker's CUDA path (current stream, ``mark``) minus the CUDA
  calls.  ``added_vs_plain`` is the median of paired differences.

Interleaved samples (chunk by chunk, step by step), medians, one process.  Prints a JSON summary on the last
line.  Usage: benchmarks/bench_device_clock.py [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's modtrace and benchmarks

from benchmarks._common import linear_relu_stack, median  # noqa: E402
from modtrace.tracking.device_timer import DeviceTimer  # noqa: E402
from modtrace.tracking.tracker import Tracker  # noqa: E402
from tests.helpers.device_clock import FakeDeviceClock, FakeStream  # noqa: E402

N = 20_000
STEP = 500  # marks between polls


class NullClock:
    device_type = "cpu"  # injected into a Tracker, it times the CPU module calls
    _stream = FakeStream(0, 1)

    def current_stream(self, device: int) -> tuple[Any, int]:
        return self._stream, 1

    def new_event(self) -> object:
        return object()

    def record(self, event: Any, stream: Any) -> bool:
        return True

    def query(self, event: Any) -> bool:
        return True

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return 0.0

    def wait(self, event: Any) -> None:
        pass

    def memory_allocated(self, device: int) -> int:
        return 0


def mark_chunks(clocks: dict[str, Any], chunks: int) -> dict[str, list[float]]:
    """ns per mark and per event polled, one sample per chunk of STEP marks,
    the clocks taking turns chunk by chunk."""
    timers = {name: DeviceTimer(clock, lambda: 0) for name, clock in clocks.items()}
    out: dict[str, list[float]] = {f"{what}_{n}": [] for what in ("mark", "poll") for n in clocks}
    out["call_noop"] = []
    stream = FakeStream(0, 1)
    seq = 0

    def noop(seq: int, device: int, stream: Any, handle: int) -> None:
        pass

    for _ in range(chunks):
        t0 = time.perf_counter_ns()
        for s in range(seq, seq + STEP):
            noop(s, 0, stream, 1)
        out["call_noop"].append((time.perf_counter_ns() - t0) / STEP)
        for name, t in timers.items():
            mark = t.mark
            t0 = time.perf_counter_ns()
            for s in range(seq, seq + STEP):
                mark(s, 0, stream, 1)
            t1 = time.perf_counter_ns()
            clock = clocks[name]
            if isinstance(clock, FakeDeviceClock):
                clock.advance(1)
            n = len(t.poll())
            t2 = time.perf_counter_ns()
            out[f"mark_{name}"].append((t1 - t0) / STEP)
            out[f"poll_{name}"].append((t2 - t1) / max(n, 1))
        seq += STEP
    return out


def tracker_steps(steps: int) -> dict[str, list[float]]:
    """ns per event of a Tracker over forward + backward steps, without and with device time
    (the null clock injected), the two taking turns step by step."""
    torch.manual_seed(0)
    model = linear_relu_stack(200)
    x = torch.randn(4, 16)
    rows: list[tuple[Any, ...]] = []
    trackers = {"tracker_plain": Tracker(rows.append), "tracker_device": Tracker(rows.append, device_clock=NullClock())}
    out: dict[str, list[float]] = {name: [] for name in trackers}
    for tracker in trackers.values():  # names the modules, makes the timer
        tracker.start()
        model(x).sum().backward()
        tracker.stop()
    turns = list(trackers.items())
    for i in range(steps):
        for name, tracker in turns[i % 2:] + turns[:i % 2]:  # neither always goes first
            rows.clear()
            tracker.start()
            t0 = time.perf_counter_ns()
            model(x).sum().backward()
            out[name].append((time.perf_counter_ns() - t0) / len(rows))
            tracker.stop()
            if tracker.device_timer is not None:
                tracker.device_timer.poll()
    timer = trackers["tracker_device"].device_timer
    assert timer is not None and timer.events_allocated > 0, "the device path was not taken"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40, help="interleaved samples of each")
    args = ap.parse_args()
    torch.set_num_threads(1)
    samples = mark_chunks({"null": NullClock(), "fake": FakeDeviceClock()}, args.repeats)
    samples.pop("poll_fake")
    samples |= tracker_steps(args.repeats)
    med = {k: round(median(v), 1) for k, v in samples.items()}
    med["mark_null_over_call_noop"] = round(med["mark_null"] / med["call_noop"], 2)
    med["added_vs_plain"] = round(median(
        m - p for m, p in zip(samples["tracker_device"], samples["tracker_plain"], strict=True)), 1)
    med["device_over_plain"] = round(med["tracker_device"] / med["tracker_plain"], 3)
    for k, v in med.items():
        print(f"{k:24s} {v:8.1f}")
    print(json.dumps({"unit": "ns per event (the _over_ figure: a ratio)", "repeats": args.repeats, **med}))


if __name__ == "__main__":
    main()
