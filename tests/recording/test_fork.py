"""Forks inside a recording: the child's module calls are counted, never
written; the parent's database, connection and writer pipes are untouched
by the child (its events after the fork are stored, with no reconnect), and
``show`` says how many calls ran unrecorded in child processes."""

from __future__ import annotations

import atexit
import json
import os
from typing import Any

import pytest
import sqlalchemy as sa
import torch
from torch import nn

from modtrace import Recorder
from tests.helpers.harness import counted_calls


def stored(url: str, run_id: int) -> tuple[int, int, int, str]:
    engine = sa.create_engine(url if "://" in url else f"sqlite:///{url}", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        n = conn.exec_driver_sql(f"SELECT COUNT(*) FROM events WHERE run_id = {run_id}").scalar()
        forks, reconnects = conn.exec_driver_sql(
            f"SELECT fork_calls, reconnects FROM run_ranks WHERE run_id = {run_id}").one()
        status = conn.exec_driver_sql(f"SELECT status FROM runs WHERE id = {run_id}").scalar()
    engine.dispose()
    return int(n), int(forks), int(reconnects), str(status)


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())  # 3 module calls per forward


@pytest.mark.parametrize("writer", ["process", "thread", "inline"])
def test_plain_fork_child_calls_are_counted_and_nothing_of_the_child_is_written(
    writer: str, any_db: str, run_cli: Any,
) -> None:
    model = net()
    x = torch.ones(1, 4)
    with counted_calls() as calls:
        with Recorder(db=any_db, run="forked", writer=writer) as rec:
            for _ in range(3):
                model(x)
                rec.step()
            rec.flush()
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: calls, a flush and a step try to write; then the exit handlers run
                code = 0
                try:
                    os.close(r)
                    for _ in range(5):
                        model(x)
                        rec.step()
                    rec.flush()
                    atexit._run_exitfuncs()
                    os.write(w, json.dumps([rec._tracker.active, rec.events_recorded]).encode())
                except BaseException:
                    code = 1
                finally:
                    os._exit(code)
            os.close(w)
            _, status = os.waitpid(pid, 0)
            child = json.loads(os.read(r, 1000) or b"null")
            os.close(r)
            assert status == 0 and child is not None and child[0] is False
            for _ in range(4):  # the parent's writer still works after the child is gone
                model(x)
                rec.step()
        rec.wait_analyzed()  # the writer process analyses the run after the with
    n, forks, reconnects, run_status = stored(any_db, rec.run_id)
    assert calls[0] == 7 * 3 and n == 2 * 3 * 7  # the parent's own 3 + 4 forwards
    assert (forks, reconnects, run_status) == (5 * 3, 0, "completed")
    shown = run_cli("show", "forked", "--db", any_db, "--format", "json")
    assert json.loads(shown.out)["fork_calls"] == 15


class Transformed(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A dataset whose items go through an nn.Module transform (in the worker)."""

    def __init__(self) -> None:
        self.transform = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        with torch.no_grad():
            return self.transform(torch.full((4,), float(i)))


def test_dataloader_workers_transforms_are_counted_not_recorded(db_path: Any, run_cli: Any,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    model = net()
    loader = torch.utils.data.DataLoader(Transformed(), batch_size=2, num_workers=2,
                                         multiprocessing_context="fork")
    with counted_calls() as calls:
        with Recorder(db=str(db_path), run="loader", writer="process") as rec:
            for batch in loader:
                model(batch)
                rec.step()
        rec.wait_analyzed()  # the writer process analyses the run after the with
    n, forks, reconnects, run_status = stored(str(db_path), rec.run_id)
    assert calls[0] == 4 * 3 and n == 2 * calls[0]  # in this process: 4 batches through the model
    assert forks == 8 * 3  # in the workers: 8 items through the 3-module transform
    assert (reconnects, run_status) == (0, "completed")
    assert "24 module call(s) ran in forked child processes" in capsys.readouterr().err
    shown = run_cli("show", "loader", "--db", str(db_path))
    assert any(line.split()[:2] == ["fork_calls", "24"] for line in shown.out.splitlines()), shown.out
    assert run_cli("check", "loader", "--db", str(db_path)).code == 0
