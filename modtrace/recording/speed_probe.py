"""A speed probe between steps: the machine's speed, measured with the steps it ran.

On a shared runner the same code runs at different speeds from one minute to
the next (a neighbour's load, the CPU's clock): whole runs of unchanged code
can differ by more than the step-wide change a CI gate must find
(docs/performance.md, "Speed probe").  Calibrating once per run does not
remove it, since the speed changes within a run.  So, when asked
(``Recorder(speed_probe=True)``, ``modtrace record --speed-probe``), the
recorder times a fixed piece of work before each recorded step: the same
small matmuls on the same tensors every time, in the program's own process
and threads, outside every module call (it is not in any step's time).  A
history gate divides each step's time by the probe taken just before it
(``modtrace.analysis.diff.speed``), so a step that is slower only because the
machine was is not a regression.

The work is the shape of a small model's training step, dispatching small
CPU ops forward and then through autograd backward: a few matmul + tanh
layers on the same tensors every time.  A forward alone followed the steps
less closely: a busy neighbour slows a forward, a backward and an optimizer
step unevenly, so the step over a forward-only probe spread wider across
unchanged runs than over this one.  Both that and what the probe costs a step
are measured in docs/performance.md, "Speed probe" (benchmarks/bench_speed_probe.py).
Its rows are (step, seq, ts_ns, probe_ns, cpu_ns, real_ns, threads, work): the
step it precedes, the seq the next event will take (so the probe lies between
events seq - 1 and seq), when it started on the events' clock, how long it
took, this thread's CPU time and the host's clock at its start, torch's
intra-op threads (with one, this thread's CPU time holds all of a CPU step's
work), and which work it timed (``ProbeWork``: probes of other work do not
compare).  The probe is short and mostly runs whole; a step on a machine with
more runnable processes than cores is preempted for part of its time, which no
probe before it shows.  The thread's CPU time over the wall time from one
probe to the next is the share of that window the program ran, and a step's
time times that share is the time it computed (left out, None, when the
events' clock is injected: the two clocks would not compare).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from modtrace.core.codes import ProbeWork

if TYPE_CHECKING:
    from modtrace.store.speeds import SpeedRow

PROBE_BATCH = 32  # rows of the probe's input
PROBE_WIDTH = 128  # its features, and the square weight's size
PROBE_REPS = 6  # matmul + tanh layers, forward then backward
PROBE_WORK = ProbeWork.TRAIN


class SpeedProbe:
    """Times ``PROBE_REPS`` layers, each a matmul of a (``PROBE_BATCH``, ``PROBE_WIDTH``) input by a
    square weight followed by tanh, forward with autograd and then backward, on ``now`` (the
    events' clock, nanoseconds), as one block: the stalls a slow stretch of the machine brings (a
    neighbour's work, the hypervisor's) are part of its speed, and a probe that left them out
    stopped following the steps (docs/performance.md, "Speed probe").  It runs with autograd
    whatever the program's mode (an optimizer's step runs without it; an inference loop may run
    under inference mode), and touches no module, so no hook sees it."""

    def __init__(self, now: Callable[[], int], cpu: bool = True) -> None:
        import torch

        self._now = now
        self._cpu = cpu
        gen = torch.Generator().manual_seed(0)
        with torch.inference_mode(False):  # ordinary tensors, usable by autograd, even if built under it
            self._x = torch.randn(PROBE_BATCH, PROBE_WIDTH, generator=gen)
            # scaled so that tanh stays off its flat ends and every layer does the same work
            self._w = (torch.randn(PROBE_WIDTH, PROBE_WIDTH, generator=gen) / PROBE_WIDTH ** 0.5).requires_grad_()
        self.rows: list[SpeedRow] = []

    def take(self, step: int, seq: int) -> None:
        """Time the probe once, before step ``step`` whose next event takes ``seq``; with ``cpu``,
        note this thread's CPU time and the host's clock beside it."""
        import torch

        cpu, real = (time.thread_time_ns(), time.perf_counter_ns()) if self._cpu else (None, None)
        w = self._w
        with torch.inference_mode(False), torch.enable_grad():
            t0 = self._now()
            y = self._x
            for _ in range(PROBE_REPS):
                y = torch.tanh(y @ w)
            torch.autograd.backward(y.sum())
            w.grad = None  # the next probe's backward writes a fresh gradient: the same work each time
            t1 = self._now()
        self.rows.append((step, seq, t0, t1 - t0, cpu, real, torch.get_num_threads(), int(PROBE_WORK)))
