"""scripts/gpu_check.py on a machine without CUDA: it says so, lists what of
the phase-2 API the build has, and exits 0 without checking anything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the script runs the full check (minutes)")
def test_without_cuda_it_says_no_cuda_and_what_the_build_has(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--db-dir", str(tmp_path)], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["cuda"] is False and summary["skipped"] == "no CUDA"
    assert "checks" not in summary
    api = summary["phase2_api"]
    assert {"Recorder(device_time=)", "event_log.device_ts_ns", "event_log.mem_bytes", "spans.device_duration_ns",
            "spans.device_self_ns", "spans.mem_delta_bytes", "spans.mem_max_bytes",
            "modtrace record --no-device-time", "modtrace tree --clock"} <= set(api)
    assert all(isinstance(v, bool) for v in api.values())
