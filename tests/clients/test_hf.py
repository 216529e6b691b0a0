"""Hugging Face models (built from small configs, nothing downloaded) recorded
in training: the record matches what torch's own hooks see."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

import modtrace
from tests.helpers.clients import (
    backward_fqns,
    check_rows,
    forward_sequence,
    modules_with_grads,
    spans_nest_in_time,
    torch_hook_log,
)
from tests.helpers.database import db_rows
from tests.helpers.training import train

pytestmark = pytest.mark.slow  # real clients: transformers, Lightning, inductor

VOCAB, SEQ, BATCH = 64, 8, 2


def gpt2() -> tuple[nn.Module, Callable[[], dict[str, torch.Tensor]]]:
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    return transformers.GPT2LMHeadModel(cfg), lambda: {"input_ids": ids, "labels": ids}


def bert() -> tuple[nn.Module, Callable[[], dict[str, torch.Tensor]]]:
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=16)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    return transformers.BertForMaskedLM(cfg), lambda: {"input_ids": ids, "labels": labels}


def t5() -> tuple[nn.Module, Callable[[], dict[str, torch.Tensor]]]:
    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                decoder_start_token_id=0, pad_token_id=0)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ))
    return transformers.T5ForConditionalGeneration(cfg), lambda: {"input_ids": ids, "labels": ids.flip(1)}


MODELS = {"gpt2": gpt2, "bert_mlm": bert, "t5": t5}


@pytest.mark.parametrize("name", list(MODELS))
def test_hugging_face_training_steps(name: str, db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model, batch = MODELS[name]()
    model.train()
    with torch_hook_log() as (seen, called), modtrace.Recorder(db=str(db_path), run=name) as _rec:
        train(model, 3, loss=lambda m: m(**batch()).loss, opt=torch.optim.AdamW(model.parameters(), lr=1e-3))
    _rec.wait_analyzed()  # the writer process analyses the run after the with
    # the forward enter/exit sequence is what torch's global hooks saw, named as torch's ModuleTracker names them
    recorded = forward_sequence(str(db_path))
    assert len(recorded) == len(seen) > 0
    assert recorded == seen
    assert db_rows(str(db_path), "SELECT DISTINCT step FROM events ORDER BY step") == [(0,), (1,), (2,)]
    # every called module whose own parameters got a gradient has a backward span
    with_grads = modules_with_grads(called)
    assert with_grads and with_grads <= backward_fqns(str(db_path))
    assert spans_nest_in_time(str(db_path)) == []
    check_rows(run_cli, str(db_path))
    # one modules row per name: a module built in every forward (BERT's CrossEntropyLoss) keeps its name
    names = [f for (f,) in db_rows(str(db_path), "SELECT fqn FROM modules")]
    assert len(names) == len(set(names))
    assert not [n for n in names if "#" in n]


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_hugging_face_activation_checkpointing_is_linked_recompute(  # type: ignore[no-untyped-def]
        reentrant: bool, db_path: Path, run_cli) -> None:
    """HF's activation checkpointing (torch.utils.checkpoint underneath, either kind): every
    module call torch sees inside a backward graph task is a recompute linked to its forward call."""
    torch.manual_seed(0)
    model, batch = gpt2()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    names = {id(m): type(model).__name__ + (f".{n}" if n else "") for n, m in model.named_modules()}
    in_backward: list[str] = []  # the oracle: torch's own hooks and graph task id

    def pre(mod: nn.Module, args: Any) -> None:
        if torch._C._current_graph_task_id() != -1 and id(mod) in names:
            in_backward.append(names[id(mod)])

    handle = register_module_forward_pre_hook(pre)
    try:
        with modtrace.Recorder(db=str(db_path), run="hf-ckpt") as rec:
            train(model, 2, loss=lambda m: m(**batch()).loss, opt=torch.optim.AdamW(model.parameters(), lr=1e-3))
        rec.wait_analyzed()
    finally:
        handle.remove()
    db = str(db_path)
    assert any(".transformer.h.0" in n for n in in_backward)
    recomputed = [f for (f,) in db_rows(db, "SELECT fqn FROM event_log WHERE kind = 'enter' AND phase = 'recompute' ORDER BY seq")]
    assert recomputed == in_backward
    assert db_rows(db, "SELECT count(*) FROM events WHERE phase = 3") == [(0,)]  # no backward_call
    assert db_rows(db, "SELECT count(*) FROM spans s WHERE phase = 'recompute' AND NOT EXISTS (SELECT 1 FROM spans f"
                       " WHERE f.phase = 'forward' AND f.call_id = s.call_id AND f.fqn = s.fqn)") == [(0,)]
    check_rows(run_cli, db)
