"""A small GPT-style decoder: next-token prediction on a token stream.

Token + position embedding, `layers` pre-LN blocks (causal self-attention through
F.scaled_dot_product_attention, then a GELU MLP), a final LayerNorm and an untied LM head.

It consumes tokens (`DATA`): as `train.workload` it trains on `data.source: text` (byte tokens:
set `vocab_size` to 256 or more), a sample being `seq_len` + 1 tokens of the corpus. The speedup
study and `scalelab bench mfu` feed it its own synthetic batches (`synthetic_batch`): sequences of
a seeded random Markov chain where every token has `successors` equally likely next tokens (a
table drawn from `data_seed`), so the best possible loss is ln(successors) and a model that learns
shows it within a few steps. Nothing is downloaded. `input_shape` and `num_classes` are ignored:
the sequence length and vocabulary are knobs here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

DATA = "tokens"  # what it trains on; scalelab.config refuses it with a features source


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    vocab_size: int = field(default=512, metadata={"ge": 2})
    seq_len: int = field(default=128, metadata={"ge": 1})
    d_model: int = field(default=128, metadata={"ge": 1})
    layers: int = field(default=2, metadata={"ge": 1})
    heads: int = field(default=2, metadata={"ge": 1})
    mlp_ratio: int = field(default=4, metadata={"ge": 1})
    dropout: float = field(default=0.0, metadata={"ge": 0.0, "lt": 1.0})
    successors: int = field(default=4, metadata={"ge": 1, "doc": "next tokens each token can have (data)"})
    data_seed: int = field(default=0, metadata={"ge": 0, "doc": "seeds the Markov chain's table"})

    def check(self, prefix: str) -> None:
        from scalelab.config import ConfigError

        if self.d_model % self.heads:
            raise ConfigError(
                f"{prefix}.d_model = {self.d_model} is not allowed with {prefix}.heads = {self.heads}: "
                "d_model must be a multiple of heads"
            )
        if self.successors > self.vocab_size:
            raise ConfigError(f"{prefix}.successors = {self.successors} is not allowed: at most vocab_size")


class Block(nn.Module):
    """Pre-LN: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        d = cfg.d_model
        self.heads, self.dropout = cfg.heads, cfg.dropout
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, cfg.mlp_ratio * d), nn.GELU(), nn.Linear(cfg.mlp_ratio * d, d))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for name, p in self.named_parameters():  # GPT-2's initialization
            if p.dim() > 1:
                std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, time <= seq_len) -> logits (batch, time, vocab)."""
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than seq_len = {self.cfg.seq_len}")
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model(cfg: Config, *, input_shape: list[int], num_classes: int) -> nn.Module:
    return GPT(cfg)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """Each transformer block is one FSDP unit (embeddings, final LN and head stay with the root)."""
    return [m for m in model.modules() if isinstance(m, Block)]


def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of the batch."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def metrics(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sums over every token of the batch (not per sequence); `count` is the number of tokens."""
    flat, y = logits.float().flatten(0, 1), targets.flatten()
    return {
        "loss_sum": F.cross_entropy(flat, y, reduction="sum"),
        "correct": (flat.argmax(dim=1) == y).sum(),
        "count": torch.tensor(y.numel(), device=y.device),
    }


def transitions(cfg: Config) -> torch.Tensor:
    """(vocab, successors): the next tokens each token can have, drawn from `data_seed`."""
    gen = torch.Generator().manual_seed(cfg.data_seed)
    return torch.randint(cfg.vocab_size, (cfg.vocab_size, cfg.successors), generator=gen)


def synthetic_batch(
    cfg: Config, batch_size: int, *, device: torch.device | str = "cpu", generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each (batch, seq_len) token ids: one Markov-chain walk per row, the targets
    shifted by one. Drawn on the CPU from `generator` (default: torch's global RNG), then moved."""
    table = transitions(cfg)
    walk = torch.empty(batch_size, cfg.seq_len + 1, dtype=torch.long)
    walk[:, 0] = torch.randint(cfg.vocab_size, (batch_size,), generator=generator)
    picks = torch.randint(cfg.successors, (batch_size, cfg.seq_len), generator=generator)
    for i in range(cfg.seq_len):
        walk[:, i + 1] = table[walk[:, i], picks[:, i]]
    walk = walk.to(device)
    return walk[:, :-1], walk[:, 1:]
