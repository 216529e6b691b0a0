"""scripts/train_tiny.py: the bundled example model, run directly and under ``modtrace record``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa
import torch

from modtrace.store.engine import open_store
from modtrace.store.runs import resolve_run, run_details

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "train_tiny.py"


@pytest.fixture(scope="module")
def tt() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_tiny", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_plain_torch_no_modtrace_import() -> None:
    import ast

    imported = set()
    for node in ast.walk(ast.parse(SCRIPT.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "torch" in imported and "modtrace" not in imported


def test_runs_and_learns(tt: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert tt.main(["--steps", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    losses = [float(line.split()[-1]) for line in lines if line.startswith("step ")]
    assert len(losses) == 6
    assert losses[-1] < losses[0]  # the synthetic sequences are learnable
    assert lines[-1].startswith("done: 6 steps in ")


def test_architecture_decoder_only_with_tied_head(tt: ModuleType) -> None:
    model = tt.TinyLM(vocab=256, d_model=64, n_heads=4, n_blocks=4, seq_len=32)
    assert model.lm_head.weight is model.tok_emb.weight
    assert len(model.blocks) == 4
    block = model.blocks[0]
    assert [type(m).__name__ for m in block.children()] == ["LayerNorm", "CausalSelfAttention", "LayerNorm", "MLP"]
    # Causal: changing a later token never changes an earlier position's logits.
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (2, 16, 256)
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.equal(a[:, 10:], b[:, 10:])


def test_slow_block_does_more_work_with_the_same_result(tt: ModuleType) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    base = tt.TinyLM(256, 64, 4, 4, 32)
    torch.manual_seed(0)
    slow = tt.TinyLM(256, 64, 4, 4, 32, slow_block=2)
    x = torch.randn(8, 32, 64)

    def flops(block: torch.nn.Module) -> int:
        with FlopCounterMode(display=False) as counter:
            block(x).sum().backward()
        return int(counter.get_total_flops())

    base_flops = [flops(b) for b in base.blocks]
    slow_flops = [flops(b) for b in slow.blocks]
    assert slow_flops[:2] == base_flops[:2] and slow_flops[3] == base_flops[3]
    assert slow_flops[2] >= 1.25 * base_flops[2]  # "measurably slower": at least 25% more arithmetic
    with torch.no_grad():
        torch.testing.assert_close(slow(torch.arange(32).view(1, 32)), base(torch.arange(32).view(1, 32)))
    # The extra work is not extra module calls: the module tree stays the same.
    assert [n for n, _ in slow.named_modules()] == [n for n, _ in base.named_modules()]


def test_checkpointing_gives_the_same_gradients(tt: ModuleType) -> None:
    grads = []
    for use_checkpoint in (False, True):
        torch.manual_seed(0)
        model = tt.TinyLM(256, 64, 4, 2, 32, use_checkpoint=use_checkpoint)
        x, y = tt.synthetic_batch(torch.Generator().manual_seed(0), 256, 4, 32)
        torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_bad_slow_block_is_a_usage_error(tt: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        tt.main(["--slow-block", "4"])
    assert exc.value.code == 2
    assert "--slow-block must be in 0..3" in capsys.readouterr().err


def _fqns_and_phases(db: str, ref: str) -> tuple[dict[str, object], set[str], set[int]]:
    store = open_store(db)
    try:
        run = resolve_run(store, ref)
        info = run_details(store, run.id)
        with store.engine.connect() as conn:
            fqns = {r[0] for r in conn.execute(sa.text(f"SELECT fqn FROM modules WHERE run_id = {run.id}"))}
            phases = {int(r[0]) for r in conn.execute(sa.text(f"SELECT DISTINCT phase FROM events WHERE run_id = {run.id}"))}
    finally:
        store.dispose()
    return info, fqns, phases


def test_recorded_baseline_slow_and_checkpointed_runs(run_cli, db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(REPO)
    for name, extra in [("base", []), ("slow", ["--slow-block", "2"]), ("ckpt", ["--checkpoint"])]:
        res = run_cli("record", "--run", name, "-q", "scripts/train_tiny.py", "--steps", "3", "--quiet", *extra)
        assert res.code == 0, res.err
        assert "done: 3 steps" in res.out
    base, base_fqns, base_phases = _fqns_and_phases(str(db_path), "base")
    slow, slow_fqns, _ = _fqns_and_phases(str(db_path), "slow")
    ckpt, _, ckpt_phases = _fqns_and_phases(str(db_path), "ckpt")
    for info in (base, slow, ckpt):
        assert info["status"] == "completed" and info["steps"] == 3  # advanced by AdamW's step hook
    assert {"TinyLM", "TinyLM.tok_emb", "TinyLM.blocks.3.mlp.fc", "TinyLM.blocks.0.attn.qkv", "TinyLM.lm_head"} <= base_fqns
    assert slow_fqns == base_fqns and slow["events"] == base["events"]
    assert base_phases == {0, 1} and ckpt_phases == {0, 1, 2}  # recompute only with --checkpoint
    assert sys.argv[0] != "scripts/train_tiny.py"  # the runner restored this process's argv
