"""A Hugging Face mixture-of-experts model (Qwen2-MoE, eager experts, built from a small config,
nothing downloaded): which experts a token is routed to depends on the data, so the calls per
step of the experts' code vary inside a run; ``modtrace diff`` must not call that a structure
change, and must still report an expert module that a candidate really drops."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import transformers
from torch import nn

import modtrace

pytestmark = pytest.mark.slow  # a real client: transformers

VOCAB, SEQ, STEPS = 64, 4, 12
EXPERTS_ACT = "Qwen2MoeForCausalLM.model.layers.0.mlp.experts.act_fn"


def qwen2_moe(dense_layers: list[int]) -> nn.Module:
    cfg = transformers.Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        num_experts=8, num_experts_per_tok=2, max_position_embeddings=32, decoder_sparse_step=1,
        mlp_only_layers=dense_layers,
    )
    cfg._experts_implementation = "eager"  # a loop over the experts a batch routes to: calls depend on data
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(cfg)


def record(db: str, name: str, seed: int, dense_layers: list[int] | None = None) -> list[int]:
    """Train STEPS steps recorded as ``name``; returns the oracle: layer 0's expert activation
    calls per step, counted by torch's own forward hook."""
    model = qwen2_moe(dense_layers or [])
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(seed)
    counts: list[int] = []
    act = model.model.layers[0].mlp.experts.act_fn
    handle = act.register_forward_hook(lambda *_: counts.__setitem__(-1, counts[-1] + 1))
    try:
        with modtrace.Recorder(db=db, run=name, handle_sigterm=False) as rec:
            for _ in range(STEPS):
                counts.append(0)
                ids = torch.randint(0, VOCAB, (1, SEQ), generator=data)
                opt.zero_grad()
                out: Any = model(input_ids=ids, labels=ids)
                out.loss.backward()
                opt.step()
        rec.wait_analyzed()
    finally:
        handle.remove()
    return counts


SEEN: dict[str, list[int]] = {}


@pytest.fixture(scope="module")
def moe_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = str(tmp_path_factory.mktemp("moe") / "moe.db")
    SEEN["moe-a"] = record(db, "moe-a", seed=1)
    SEEN["moe-b"] = record(db, "moe-b", seed=2)
    record(db, "moe-dense1", seed=2, dense_layers=[1])  # layer 1 an MLP: its experts are gone
    return db


def test_data_dependent_calls_are_no_structure_change(moe_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    # the premise, from torch's hooks: the experts' activation is called a varying number of times per step
    for run in ("moe-a", "moe-b"):
        assert len(set(SEEN[run][1:])) > 1
    res = run_cli("diff", "--db", moe_db, "moe-a", "moe-b", "--fail-on", "structure", "--format", "json")
    assert res.code == 0, res.out + res.err
    doc = json.loads(res.out)
    assert doc["structure"] == []
    varying = {(c["fqn"], c["phase"]): c for c in doc["calls_per_step"]}
    act = varying[(EXPERTS_ACT, "forward")]
    assert act["changed"] is False and act["base"]["min"] < act["base"]["max"]
    # the distribution shown is the one torch's hooks saw (steps after the first, skipped as warm-up)
    for side, run in (("base", "moe-a"), ("cand", "moe-b")):
        seen = sorted(SEEN[run][1:])
        assert (act[side]["min"], act[side]["max"]) == (seen[0], seen[-1])
    table = run_cli("diff", "--db", moe_db, "moe-a", "moe-b", "--fail-on", "structure")
    assert table.code == 0 and "Calls per step that vary from step to step" in table.out


def test_a_dropped_expert_module_is_reported(moe_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("diff", "--db", moe_db, "moe-a", "moe-dense1", "--fail-on", "structure", "--format", "json")
    assert res.code == 1, res.out + res.err
    removed = {s["fqn"] for s in json.loads(res.out)["structure"] if s["kind"] == "module_removed"}
    layer1 = "Qwen2MoeForCausalLM.model.layers.1.mlp"
    assert {f"{layer1}.experts", f"{layer1}.shared_expert"} <= removed
