"""Issue 18: steps without an optimizer.

Real inference under ``modtrace record`` (a tiny Hugging Face GPT-2 built
from a config, greedy ``generate()``), a plain eval loop, and training loops
whose steps must stay exactly what they were (gradient accumulation, an
optimizer closure as Lightning runs it).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
from torch import nn

import modtrace
from modtrace.analysis.steps import ROOT_SCHEMA, assign_steps, common_kind, kind_counts, step_kinds
from modtrace.core.step_rules import StepRuleError, resolve_rule
from modtrace.store.engine import open_store
from modtrace.store.runs import resolve_run, run_details
from modtrace.tracking.step_kind import input_kind
from tests.helpers.training import train

pytest.importorskip("transformers")

GENERATE = textwrap.dedent(
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64,
                        bos_token_id=0, eos_token_id=None)
    model = GPT2LMHeadModel(config).eval()
    prompt = torch.randint(1, 100, (1, 7))
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 27), out.shape
    """
)

def _details(db: Path, ref: str) -> dict[str, Any]:
    store = open_store(str(db))
    try:
        return run_details(store, resolve_run(store, ref).id)
    finally:
        store.dispose()


@pytest.fixture
def scripts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "gen.py"
    base.write_text(GENERATE)
    return {"base": base}


def test_generate_gets_a_step_per_model_call_and_two_kinds(run_cli, scripts, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    rec = run_cli("record", "--run", "g1", str(scripts["base"]))
    assert rec.code == 0, rec.err
    assert "20 steps" in rec.err  # the summary line counts root calls under auto
    info = _details(db_path, "g1")
    assert info["step_on"] == "auto"

    shown = json.loads(run_cli("show", "g1", "--format", "json").out)
    assert (shown["steps"], shown["step_rule"]) == (20, "root")
    listed = run_cli("runs", "--format", "json")
    row = json.loads(listed.out)[0]
    assert (row["steps"], row["step_on"]) == (20, "auto: root")

    tree = json.loads(run_cli("tree", "g1", "--format", "json", "--max-depth", "0").out)
    assert [(n["fqn"], n["calls"], n["steps"]) for n in tree] == [("GPT2LMHeadModel", 20, 20)]
    prefill = json.loads(run_cli("tree", "g1", "--format", "json", "--max-depth", "0",
                                 "--step-kind", "input_ids=1x7").out)
    decode = json.loads(run_cli("tree", "g1", "--format", "json", "--max-depth", "0",
                                "--step-kind", "input_ids=1x1").out)
    assert (prefill[0]["steps"], decode[0]["steps"]) == (1, 19)
    first = json.loads(run_cli("tree", "g1", "--format", "json", "--max-depth", "0", "--step", "0").out)
    assert first[0]["calls"] == 1  # step 0 is the prefill call alone

    # the recorded counter never moved: as optimizer steps the whole run is one step
    one = json.loads(run_cli("tree", "g1", "--format", "json", "--max-depth", "0", "--step-on", "optimizer").out)
    assert (one[0]["calls"], one[0]["steps"]) == (20, 1)

    bad = run_cli("tree", "g1", "--step-kind", "input_ids=9x9")
    assert bad.code == 2
    assert bad.err.strip().splitlines() == [
        "modtrace: error: --step-kind input_ids=9x9: run 'g1' has no steps of that kind "
        "(its kinds: input_ids=1x1 (19), input_ids=1x7 (1))"
    ]


def _generate(db: Path, run: str, *, slower_ns: int = 0) -> None:
    """``GENERATE`` in this process, recorded on a work clock: every duration is the clock's ticks
    (one per read) plus, with ``slower_ns``, that much work in block 1's attention per call, so a
    diff of these runs is judged on the stored times alone, whatever the host's load."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    from tests.helpers.diff_runs import WorkClock

    clock = WorkClock()

    class SlowerAttention(GPT2Attention):
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            out = super().forward(*args, **kwargs)
            clock.work(slower_ns)
            return out

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64, bos_token_id=0,
                        eos_token_id=None)
    model = GPT2LMHeadModel(config)
    model.eval()  # type: ignore[no-untyped-call]
    if slower_ns:
        model.transformer.h[1].attn.__class__ = SlowerAttention
    prompt = torch.randint(1, 100, (1, 7))
    with torch.no_grad(), modtrace.Recorder(db=str(db), run=run, clock=clock, handle_sigterm=False) as rec:
        model.generate(prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
    rec.wait_analyzed()


def test_diff_of_generate_runs_compares_decode_steps_and_blames_the_slower_block(run_cli, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    _generate(db_path, "a1")
    _generate(db_path, "a2")
    _generate(db_path, "slow", slower_ns=200_000)

    aa = run_cli("diff", "a1", "a2", "--format", "json")
    doc = json.loads(aa.out)
    assert aa.code == 0, aa.out
    assert (doc["summary"]["regressions"], doc["summary"]["improvements"], doc["summary"]["structure_changes"]) == (0, 0, 0)
    assert doc["base"]["step_kind"] == "input_ids=1x1"
    assert doc["base"]["step_kinds"] == [{"kind": "input_ids=1x1", "steps": 19}, {"kind": "input_ids=1x7", "steps": 1}]
    assert doc["base"]["steps"] == 18  # 19 decode steps, the first left out as warm-up

    text = run_cli("diff", "a1", "a2").out
    assert ("steps of kind input_ids=1x1 compared (--step-kind); steps per kind: "
            "base input_ids=1x1: 19, input_ids=1x7: 1; cand input_ids=1x1: 19, input_ids=1x7: 1") in " ".join(text.split())

    res = run_cli("diff", "a1", "slow", "--format", "json")
    doc = json.loads(res.out)
    assert res.code == 1
    blamed = [(t["fqn"], t["phase"]) for t in doc["timing"] if t["verdict"] == "regression"]
    assert blamed == [("GPT2LMHeadModel.transformer.h.1.attn", "forward")]
    assert doc["summary"]["structure_changes"] == 0

    md = run_cli("diff", "a1", "slow", "--format", "markdown").out
    regressions = md.split("Regressions")[1].split("###")[0]
    assert "GPT2LMHeadModel.transformer.h.1.attn" in regressions
    assert "h.0.attn" not in regressions and "h.1.mlp" not in regressions

    # prefill against prefill: one step each, so nothing can be significant, but it is what is compared
    prefill = json.loads(run_cli("diff", "a1", "slow", "--format", "json", "--skip-steps", "0",
                                 "--step-kind", "input_ids=1x7").out)
    assert (prefill["base"]["steps"], prefill["cand"]["steps"], prefill["base"]["step_kind"]) == (1, 1, "input_ids=1x7")


def test_diff_of_runs_under_different_rules_says_so(run_cli, scripts, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert run_cli("record", "-q", "--run", "auto", str(scripts["base"])).code == 0
    assert run_cli("record", "-q", "--run", "opt", "--step-on", "optimizer", str(scripts["base"])).code == 0
    assert _details(db_path, "opt")["step_on"] == "optimizer"
    out = run_cli("diff", "auto", "opt", "--skip-steps", "0").out
    notes = [line for line in out.splitlines() if "different rules" in line]
    assert notes == ["note: the runs' steps follow different rules: base's are root calls, cand's optimizer steps "
                     "(--step-on chooses one rule for both)"]
    # one rule for both, chosen after the fact: the note goes
    same = run_cli("diff", "auto", "opt", "--step-on", "root").out
    assert "different rules" not in same
    assert json.loads(run_cli("diff", "auto", "opt", "--step-on", "root", "--format", "json").out)["cand"]["steps"] == 18


def test_bad_step_rules_are_usage_errors_and_create_nothing(run_cli, scripts, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("record", "--step-on", "tokens", str(scripts["base"]))
    assert res.code == 2
    assert res.err.strip().splitlines() == [
        "modtrace: error: Invalid value for '--step-on': 'tokens' is not one of 'auto', 'optimizer', 'root', 'manual'."
    ]
    assert not db_path.exists()
    with pytest.raises(ValueError, match="step_on must be one of auto, optimizer, root, manual, not 'tokens'"):
        modtrace.Recorder(run="x", step_on="tokens")
    assert not db_path.exists()
    assert run_cli("record", "-q", "--run", "g", str(scripts["base"])).code == 0
    for cmd in (("tree", "g"), ("diff", "g", "g"), ("report", "g", "-o", "r.html")):
        res = run_cli(*cmd, "--step-on", "tokens")
        assert res.code == 2 and len(res.err.strip().splitlines()) == 1 and "--step-on" in res.err
    assert not Path("r.html").exists()
    ok = run_cli("report", "g", "--step-on", "root", "-o", "r.html", "-q")
    assert ok.code == 0 and '"step":19,' in Path("r.html").read_text()  # the per-step table has the root steps


# -- eval and training loops ----------------------------------------------------


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _tree_steps(run_cli, run: str, *extra: str) -> list[int]:  # type: ignore[no-untyped-def]
    """The steps of run's root node per --step value: calls of the root module in each step."""
    nodes = json.loads(run_cli("tree", run, "--format", "json", "--max-depth", "0", *extra).out)
    return [n["steps"] for n in nodes if n["fqn"] == "Sequential" and n["phase"] == "forward"]


def test_an_eval_loop_gets_one_step_per_batch(run_cli, any_db: str) -> None:  # type: ignore[no-untyped-def]
    model = _net().eval()
    batches = [torch.randn(4, 8) for _ in range(5)] + [torch.randn(3, 8)]  # a short last batch
    with modtrace.Recorder(db=any_db, run="eval") as rec, torch.no_grad():
        for x in batches:
            model(x)
            assert rec.step_count > 0
    rec.wait_analyzed()  # the writer process analyses the run after the with
    assert rec.step_count == 6
    shown = json.loads(run_cli("show", "eval", "--db", any_db, "--format", "json").out)
    assert (shown["steps"], shown["step_rule"]) == (6, "root")
    assert _tree_steps(run_cli, "eval", "--db", any_db) == [6]
    for step in range(6):
        node = json.loads(run_cli("tree", "eval", "--db", any_db, "--format", "json", "--step", str(step),
                                  "--max-depth", "0").out)
        assert node[0]["calls"] == 1
    assert _tree_steps(run_cli, "eval", "--db", any_db, "--step-kind", "input=4x8") == [5]
    assert _tree_steps(run_cli, "eval", "--db", any_db, "--step-kind", "input=3x8") == [1]
    listed = json.loads(run_cli("runs", "--db", any_db, "--format", "json").out)
    assert [(r["steps"], r["step_on"]) for r in listed] == [(6, "auto: root")]


@pytest.mark.parametrize(("accumulate", "closure"), [(2, False), (1, True)], ids=["accumulate-2", "closure"])
def test_training_steps_stay_optimizer_steps(run_cli, db_path: Path, accumulate: int, closure: bool) -> None:  # type: ignore[no-untyped-def]
    with modtrace.Recorder(run="train") as rec:
        train(_net(), 3, accumulate=accumulate, closure=closure)
    rec.wait_analyzed()  # the writer process analyses the run after the with
    assert rec.step_count == 3
    shown = json.loads(run_cli("show", "train", "--format", "json").out)
    assert (shown["steps"], shown["step_rule"]) == (3, "optimizer")
    nodes = json.loads(run_cli("tree", "train", "--format", "json", "--max-depth", "0").out)
    assert {(n["phase"], n["calls"], n["steps"]) for n in nodes} == {("forward", 3 * accumulate, 3),
                                                                      ("backward", 3 * accumulate, 3)}
    # the same run cut at every forward instead
    roots = json.loads(run_cli("tree", "train", "--format", "json", "--max-depth", "0", "--step-on", "root").out)
    assert {(n["phase"], n["steps"]) for n in roots} == {("forward", 3 * accumulate), ("backward", 3 * accumulate)}


def test_manual_steps_leave_the_optimizer_out(run_cli, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = _net()
    with modtrace.Recorder(run="manual", step_on="manual") as rec:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(4):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            if i % 2 == 1:
                rec.step()
    rec.wait_analyzed()  # the writer process analyses the run after the with
    assert rec.step_count == 2
    shown = json.loads(run_cli("show", "manual", "--format", "json").out)
    assert (shown["step_on"], shown["steps"], shown["step_rule"]) == ("manual", 2, "manual")
    res = run_cli("tree", "manual", "--step-on", "optimizer")
    assert res.code == 2
    assert res.err.strip() == ("modtrace: error: --step-on optimizer: run 'manual': its optimizer steps were not "
                               "recorded (it was recorded with step_on manual)")
    assert _tree_steps(run_cli, "manual", "--step-on", "root") == [4]


def test_root_steps_keep_recorder_steps(run_cli, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Under root, Recorder.step() still ends a step: two calls of a step with a boundary between."""
    model = _net().eval()
    with modtrace.Recorder(run="r", step_on="root") as rec, torch.no_grad():
        model(torch.randn(4, 8))
        rec.step()
        model(torch.randn(4, 8))
    rec.wait_analyzed()  # the writer process analyses the run after the with
    assert rec.step_count == 2
    assert _tree_steps(run_cli, "r") == [2]


# -- the pure parts ------------------------------------------------------------


def test_assign_steps_cuts_at_root_calls_and_recorded_boundaries() -> None:
    frame = pl.DataFrame(
        {"rank": [0] * 8 + [1] * 2, "span_id": [0, 2, 4, 6, 8, 10, 12, 14, 0, 3],
         "step": [0, 0, 0, 0, 0, 1, 1, 1, 0, 0], "x": list(range(10))},
        schema_overrides={"rank": pl.Int32, "step": pl.Int32},
    )
    roots = pl.DataFrame({"rank": [0, 0, 0, 1], "seq": [2, 6, 12, 0], "thread_id": [0, 0, 0, 0],
                          "kind": ["a", "b", "b", "a"]}, schema=ROOT_SCHEMA)
    assert assign_steps(frame, roots, "optimizer") is frame
    out = assign_steps(frame.reverse(), roots, "root").reverse()  # row order is kept
    assert out["x"].to_list() == list(range(10))
    # rank 0: before the first root call, two root calls, a recorded boundary, one more root call
    assert out["step"].to_list() == [0, 1, 1, 2, 2, 3, 4, 4, 0, 0]
    assert out.schema == frame.schema
    kinds = step_kinds(out, roots)
    assert kinds.rows() == [(0, 0, None), (0, 1, "a"), (0, 2, "b"), (0, 3, None), (0, 4, "b"), (1, 0, "a")]
    assert kind_counts(kinds) == [("a", 2), ("b", 2), (None, 2)]


def test_assign_steps_keeps_each_thread_with_its_own_root_call() -> None:
    # two worker threads serving interleaved requests (roots at 0 and 1), then thread 0's next request
    # (root at 5); thread 2 made no root call (autograd's device thread): the rank's latest
    frame = pl.DataFrame(
        {"rank": [0] * 7, "span_id": [0, 1, 2, 3, 4, 5, 6], "thread_id": [0, 1, 0, 1, 2, 0, 1], "step": [0] * 7},
        schema_overrides={"rank": pl.Int32, "step": pl.Int32, "thread_id": pl.Int32},
    )
    roots = pl.DataFrame({"rank": [0, 0, 0], "seq": [0, 1, 5], "thread_id": [0, 1, 0], "kind": [None] * 3},
                         schema=ROOT_SCHEMA)
    assert assign_steps(frame, roots, "root")["step"].to_list() == [0, 1, 0, 1, 1, 2, 1]


def test_common_kind_is_the_most_steps_among_kinds_both_runs_have() -> None:
    def kinds(*values: str | None) -> pl.DataFrame:
        return pl.DataFrame({"rank": [0] * len(values), "step": list(range(len(values))), "kind": list(values)},
                            schema={"rank": pl.Int32, "step": pl.Int32, "kind": pl.String})

    assert common_kind(kinds("a", "a"), kinds("a")) is None  # one kind: nothing to choose
    assert common_kind(kinds("p", "d", "d"), kinds("p", "d", "d")) == "d"
    assert common_kind(kinds("p", "p", "d"), kinds("d", "d", "d", "p")) == "d"
    assert common_kind(kinds("p", None, None), kinds("p", None, None)) is None  # the no-kind steps are never chosen
    assert common_kind(kinds("p"), kinds("d")) is None  # nothing in common


def test_resolve_rule() -> None:
    assert resolve_rule(None, "auto", made_steps=True) == "optimizer"
    assert resolve_rule(None, "auto", made_steps=False) == "root"
    assert resolve_rule(None, "optimizer", made_steps=False) == "optimizer"
    assert resolve_rule("auto", "manual", made_steps=True) == "manual"
    assert resolve_rule("root", "manual", made_steps=True) == "root"
    with pytest.raises(StepRuleError, match="cannot be told from its optimizer steps"):
        resolve_rule("manual", "auto", made_steps=True)


class _Two(nn.Module):
    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None, *, extra: Any = None) -> torch.Tensor:
        return tokens


def test_input_kind_is_the_first_tensor_argument_in_forward_order() -> None:
    m = _Two()
    t, u = torch.zeros(2, 3), torch.zeros(5)
    assert input_kind(m, (t,), {}) == "tokens=2x3"
    assert input_kind(m, (), {"mask": u, "tokens": t}) == "tokens=2x3"  # forward's order, not the call's
    assert input_kind(m, (None,), {"mask": u}) == "mask=5"
    assert input_kind(m, ([u, t],), None) == "tokens[0]=5"
    assert input_kind(m, (), {"extra": {"ids": t}}) == "extra.ids=2x3"
    assert input_kind(m, (3,), {"extra": "x"}) is None
    assert input_kind(m, (torch.tensor(1.0),), None) == "tokens=scalar"
    assert input_kind(nn.Linear(2, 2), (t,), None) == "input=2x3"
