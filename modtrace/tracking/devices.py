"""The tracker's devices: which device a module computes on, its current
stream, and, with device time on, a timing event per enter and exit
(``modtrace.tracking.device_timer``).

``Tracker`` mixes this in; every event row names its device by a small id
(``new_devices`` holds the rows not yet handed to the store) and, on a timed
device, the current stream's handle.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from modtrace.tracking.device_timer import DeviceClock, DeviceTimer


class DeviceLookup:
    """Device ids, streams and device timing, over the attributes listed below."""

    _lock: threading.Lock
    _clock: Callable[[], int]
    new_devices: list[tuple[int, str]]
    t0: int

    def _init_devices(self, device_time: bool | None, device_clock: DeviceClock | None) -> None:
        self._devices: dict[torch.device, int] = {}
        self._cuda_devices: set[int] = set()  # ids of the timed devices (CUDA, or the injected clock's type)
        self._device_objs: list[torch.device] = []
        # Device time, for an owner that polls and drains ``device_timer`` (the
        # recorder): on with ``device_time`` (None: when a clock is injected).
        # Calls on devices of the clock's type mark a timing event; the timer
        # is made when the first such device is seen.
        self.device_timer: DeviceTimer | None = None
        self.device_marks = True  # False: no timing event (a warm-up step, whose seqs are used again)
        self._device_time = device_clock is not None if device_time is None else device_time
        self._device_clock = device_clock
        self._timed_type = device_clock.device_type if device_clock is not None and self._device_time else "cuda"

    @property
    def timed_device_type(self) -> str:
        """The torch device type whose calls get device time ("cuda", or the injected clock's)."""
        return self._timed_type

    def _device(self, dev: torch.device) -> int:
        device_id = self._devices.get(dev)
        if device_id is None:
            with self._lock:
                device_id = self._devices.get(dev)
                if device_id is None:
                    device_id = len(self._devices)
                    self._devices[dev] = device_id
                    self._device_objs.append(dev)
                    if dev.type == self._timed_type:
                        self._cuda_devices.add(device_id)
                        if self._device_time and self.device_timer is None:
                            self._new_device_timer()
                    self.new_devices.append((device_id, str(dev)))
        return device_id

    def _new_device_timer(self) -> None:
        from modtrace.tracking.device_timer import CudaClock, DeviceTimer

        try:
            clock = self._device_clock if self._device_clock is not None else CudaClock()
        except Exception as exc:  # never the program's error: record host time only
            self._device_time = False
            import warnings

            warnings.warn(f"modtrace: no device time: {exc}", RuntimeWarning, stacklevel=2)
            return
        self.device_timer = DeviceTimer(clock, lambda: self._clock() - self.t0)

    def _stream(self, device_id: int | None, seq: int) -> int | None:
        """The current stream on a CUDA device (None elsewhere): a handle that
        tells streams apart within the run.  With device time on, event
        ``seq`` also gets its timing event on that stream: enters mark after
        their host timestamp, exits after what the call launched."""
        if device_id is None or device_id not in self._cuda_devices:
            return None
        timer = self.device_timer
        if timer is None:
            return int(torch.cuda.current_stream(self._device_objs[device_id]).cuda_stream)
        index = self._device_objs[device_id].index or 0
        stream, handle = timer.clock.current_stream(index)
        if self.device_marks:
            timer.mark(seq, index, stream, handle)
        return handle

    def _module_device(self, mod: nn.Module) -> torch.device | None:
        for t in itertools.chain(mod.parameters(), mod.buffers()):
            return t.device
        return None
