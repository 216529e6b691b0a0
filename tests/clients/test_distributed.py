"""DistributedDataParallel and FSDP2 (fully_shard) over gloo on CPU, 2 ranks
under ``torchrun ... -m modtrace record`` (real processes)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.helpers.clients import check_rows
from tests.helpers.database import db_rows
from tests.helpers.torchrun import torchrun_record

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    if sys.argv[1] == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    dist.destroy_process_group()
    """
)


def launch(tmp_path: Path, mode: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    db = str(tmp_path / "trace.db")
    return db, torchrun_record(tmp_path, "dist_train.py", SCRIPT, db, mode, mode)


def test_ddp_two_ranks(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db, out = launch(tmp_path, "ddp")
    assert out.returncode == 0, out.stderr[-4000:]
    assert db_rows(db, "SELECT rank, step_count FROM run_ranks ORDER BY rank") == [(0, 3), (1, 3)]
    for rank in (0, 1):
        names = {f for (f,) in db_rows(db, "SELECT DISTINCT fqn FROM spans WHERE rank = :rank", rank=rank)}
        assert names == {"DistributedDataParallel", "DistributedDataParallel.module",
                         *(f"DistributedDataParallel.module.{i}" for i in range(3))}
        phases = db_rows(db, "SELECT phase, count(*) FROM spans WHERE rank = :rank AND fqn = 'DistributedDataParallel.module.2' "
                             "GROUP BY phase ORDER BY phase", rank=rank)
        assert phases == [("backward", 3), ("forward", 3)]
    check_rows(run_cli, db)


def test_fsdp2_two_ranks(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db, out = launch(tmp_path, "fsdp")
    assert out.returncode == 0, out.stderr[-4000:]
    assert db_rows(db, "SELECT rank, step_count FROM run_ranks ORDER BY rank") == [(0, 3), (1, 3)]
    for rank in (0, 1):
        spans = db_rows(db, "SELECT fqn, phase, count(*) FROM spans WHERE rank = :rank GROUP BY fqn, phase ORDER BY fqn, phase",
                        rank=rank)
        # fully_shard swaps the classes (FSDPSequential, FSDPLinear): the root is named by its class
        assert [(f, p) for f, p, _ in spans] == [
            (f"FSDPSequential{s}", p) for s in ("", ".0", ".1", ".2") for p in ("backward", "forward")
        ], spans
        assert {n for _, _, n in spans} == {3}
    check_rows(run_cli, db)
