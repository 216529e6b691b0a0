"""The checkpointing what-if on Hugging Face GPT-2 (a small config, nothing downloaded): the
what-if asked for its blocks and its MLPs, the model recorded again with exactly those modules
checkpointed (non-reentrant): the predicted peak within 10% of the measured, as modtrace's
``step_memory`` and torch's MemTracker have it; the budget's set, recorded, fits.  On SQLite and
PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import transformers

import modtrace
from tests.helpers.memory import checkpointed, memtracker_peak, record_steps, step_memory_peak

pytestmark = pytest.mark.slow  # real clients: transformers

CONFIG = dict(vocab_size=512, n_positions=128, n_embd=128, n_layer=4, n_head=4, use_cache=False, attn_pdrop=0.0,
              resid_pdrop=0.0, embd_pdrop=0.0)
IDS = torch.randint(0, 512, (8, 128), generator=torch.Generator().manual_seed(1))


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(input_ids=IDS, labels=IDS).loss.backward()
    opt.step()
    opt.zero_grad()


def _fresh(fqns: tuple[str, ...] = ()) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG))
    model.train()
    checkpointed(model, fqns)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _record(db: str, run: str, fqns: tuple[str, ...] = ()) -> None:
    model, opt = _fresh(fqns)
    record_steps(db, run, model, opt, _step, 2)


def _close(predicted: int, measured: int) -> bool:
    return abs(predicted / measured - 1) <= 0.10


def test_gpt2_what_if_and_budget_against_the_checkpointed_runs(any_db: str, run_cli: Any) -> None:
    _record(any_db, "plain")
    with modtrace.open(any_db) as db:
        for patterns in (["transformer.h.*"], ["*.mlp"]):
            found = db.memory("plain", checkpoint=patterns).what_if
            assert found is not None and len(found.modules) == CONFIG["n_layer"]
            assert found.peak_bytes < 0.9 * found.measured_peak_bytes
            run = "ckpt-" + patterns[0].replace("*", "x")
            _record(any_db, run, found.modules)
            model, opt = _fresh(found.modules)
            ours, theirs = step_memory_peak(any_db, run), memtracker_peak(model, opt, _step, IDS)
            assert _close(found.peak_bytes, ours) and _close(found.peak_bytes, theirs), (patterns, found, ours, theirs)
        every = db.memory("plain", checkpoint=["transformer.h.*"]).what_if
    assert every is not None
    budget = (every.peak_bytes + every.measured_peak_bytes) // 2
    out = run_cli("memory", "plain", "--db", any_db, "--budget", str(budget), "--format", "json")
    assert out.code == 0, out
    plan = json.loads(out.out)["budget"]
    assert plan["found"] and plan["modules"] and plan["peak_bytes"] <= budget, plan
    _record(any_db, "fits", tuple(plan["modules"]))
    assert step_memory_peak(any_db, "fits") <= budget * 1.10
    assert _close(plan["peak_bytes"], step_memory_peak(any_db, "fits"))
