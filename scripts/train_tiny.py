"""A tiny decoder-only transformer language model, trained for a few steps on CPU.

The bundled example for ``modtrace record``: plain PyTorch, no modtrace
import.  Token embedding, N blocks of causal self-attention and MLP (pre-
LayerNorm, residual), a final LayerNorm and an output head tied to the
embedding, trained with AdamW on synthetic tokens.

    python scripts/train_tiny.py --steps 5
    modtrace record --run base scripts/train_tiny.py
    modtrace record --run slow scripts/train_tiny.py --slow-block 2

``--slow-block K`` makes block K's MLP do its matmuls several extra times
(as a careless code change would), so K is measurably slower than the other
blocks while the model's output is unchanged.  ``--checkpoint`` wraps every
block in non-reentrant activation checkpointing, so its forward is recomputed
during backward.  ``--distributed`` joins a gloo process group when launched
by torchrun (WORLD_SIZE > 1) and wraps the model in DistributedDataParallel.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d_model: int, extra_work: int = 0) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * d_model, d_model)
        self.extra_work = extra_work

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        # The "regression": recompute the up-projection functionally (no extra
        # module call, so the module tree is unchanged) and average the copies.
        # The result is the same; the cost is extra_work more matmuls.
        for _ in range(self.extra_work):
            h = (h + F.linear(x, self.fc.weight, self.fc.bias)) * 0.5
        return self.out(self.act(h))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, extra_work: int = 0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, extra_work)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(
        self, vocab: int, d_model: int, n_heads: int, n_blocks: int, seq_len: int,
        slow_block: int | None = None, slow_factor: int = 6, use_checkpoint: bool = False,
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Parameter(torch.zeros(seq_len, d_model))
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, slow_factor if i == slow_block else 0) for i in range(n_blocks)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied output head
        self.use_checkpoint = use_checkpoint
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb[: idx.shape[1]]
        for block in self.blocks:
            if self.use_checkpoint and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.lm_head(self.ln_f(x))


def synthetic_batch(gen: torch.Generator, vocab: int, batch: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens with a learnable rule (each token is the previous plus one), so the loss falls."""
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    seq = (start + torch.arange(seq_len + 1)) % vocab
    return seq[:, :-1], seq[:, 1:]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--slow-block", type=int, default=None, metavar="K", help="make block K measurably slower")
    p.add_argument("--slow-factor", type=int, default=6, help="extra matmuls the slow block does")
    p.add_argument("--checkpoint", action="store_true", help="activation checkpointing on the blocks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--distributed", action="store_true", help="gloo process group + DDP when WORLD_SIZE > 1")
    p.add_argument("--quiet", action="store_true", help="no per-step output")
    args = p.parse_args(argv)
    if args.slow_block is not None and not 0 <= args.slow_block < args.blocks:
        p.error(f"--slow-block must be in 0..{args.blocks - 1}")
    if args.d_model % args.heads:
        p.error("--d-model must be a multiple of --heads")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    distributed = args.distributed and int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank = 0
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model: nn.Module = TinyLM(
        args.vocab, args.d_model, args.heads, args.blocks, args.seq,
        slow_block=args.slow_block, slow_factor=args.slow_factor, use_checkpoint=args.checkpoint,
    )
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed + rank)
    t0 = time.perf_counter()
    loss = torch.tensor(math.nan)
    for step in range(args.steps):
        x, y = synthetic_batch(gen, args.vocab, args.batch, args.seq)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if not args.quiet and rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"done: {args.steps} steps in {time.perf_counter() - t0:.2f}s, final loss {loss.item():.4f}", flush=True)
    if distributed:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
