"""Training frameworks recorded under ``modtrace record`` (the real CLI, a real
subprocess): the Hugging Face Trainer and PyTorch Lightning."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.clients import check_rows
from tests.helpers.database import db_rows

pytestmark = pytest.mark.slow  # real clients: transformers, Lightning, inductor

REPO = Path(__file__).resolve().parents[2]

HF_TRAINER = textwrap.dedent(
    """
    import sys
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 64, (32, 8))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=sys.argv[1], max_steps=6, gradient_accumulation_steps=2, per_device_train_batch_size=2,
        use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, gradient_checkpointing=sys.argv[2] == "ckpt",
    )
    transformers.Trainer(model=model, args=args, train_dataset=data).train()
    """
)

LIGHTNING = textwrap.dedent(
    """
    import torch
    import pytorch_lightning as pl
    from torch import nn

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

        def forward(self, x):
            return self.body(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(10, 4), torch.randn(10, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), loader)
    """
)


def record(tmp_path: Path, script: str, *script_args: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(script)
    db = str(tmp_path / "trace.db")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "modtrace", "record", "--db", db, "--run", "client", "-q", str(path), *script_args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return db


def steps_of(db: str) -> tuple[int, list[int]]:
    ((count,),) = db_rows(db, "SELECT step_count FROM run_ranks")
    return count, [s for (s,) in db_rows(db, "SELECT DISTINCT step FROM events ORDER BY step")]


@pytest.mark.parametrize("mode", ["plain", "ckpt"])
def test_hugging_face_trainer(mode: str, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = record(tmp_path, HF_TRAINER, str(tmp_path / "out"), mode)
    assert steps_of(db) == (6, [0, 1, 2, 3, 4, 5])
    # two micro-batches per optimizer step: two forward calls of the model per step
    per_step = db_rows(db, "SELECT step, count(*) FROM event_log WHERE fqn = 'GPT2LMHeadModel' AND phase = 'forward' "
                           "AND kind = 'enter' GROUP BY step ORDER BY step")
    assert per_step == [(s, 2) for s in range(6)]
    assert db_rows(db, "SELECT count(*) FROM spans WHERE phase = 'backward' AND fqn = 'GPT2LMHeadModel.transformer.h.1'") == [(12,)]
    recompute = db_rows(db, "SELECT fqn, call_id FROM spans WHERE phase = 'recompute'")
    if mode == "plain":
        assert recompute == []
    else:
        # transformers checkpoints each layer's forward (not its call): the layer's submodules are recomputed
        assert {f for f, _ in recompute} >= {f"GPT2LMHeadModel.transformer.h.{i}.{m}" for i in (0, 1) for m in ("attn", "mlp")}
        forward = set(db_rows(db, "SELECT fqn, call_id FROM spans WHERE phase = 'forward'"))
        assert set(recompute) <= forward  # each recompute linked to its forward call (same call_id)
    check_rows(run_cli, db)


def test_lightning_fit(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = record(tmp_path, LIGHTNING)
    # forward and backward run inside optimizer.step (Lightning's closure): one step per optimizer step
    assert steps_of(db) == (5, [0, 1, 2, 3, 4])
    per_step = db_rows(db, "SELECT step, phase, count(*) FROM spans WHERE fqn = 'Tiny' GROUP BY step, phase ORDER BY step, phase")
    assert per_step == [(s, p, 1) for s in range(5) for p in ("backward", "forward")]
    assert {f for (f,) in db_rows(db, "SELECT DISTINCT fqn FROM spans WHERE phase = 'backward'")} == {
        "Tiny", "Tiny.body", "Tiny.body.0", "Tiny.body.1", "Tiny.body.2"}
    check_rows(run_cli, db)
