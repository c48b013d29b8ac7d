"""Looking at a language model: load a trained model file and sample text from it.

    scalelab sample --checkpoint results/train/best.pt --prompt "def " --tokens 200 --temperature 0.8 --seed 0
    scalelab sample --run 3f2a9c...          # the model.pt of the run that results/train/run.json names

`model.pt` and `best.pt` are a dict: `model` (the plain model's state dict), `workload`,
`model_config`, `input_shape` and `num_classes` (what rebuilds the model), and in best.pt `best`
(`metric`, `value`, `step`). `load_model` rebuilds it (tensors and plain values only:
`weights_only=True`). Tokens are bytes (`data.text.tokenizer: bytes`): a prompt is its UTF-8 bytes,
and text comes back decoded with invalid bytes replaced. The same seed gives the same text.

During training, each validation of a token workload samples `train.sample_tokens` tokens after the
start of two validation documents and logs them as `samples/step-<N>.txt` in the run.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalelab.data.store import DataError, TokenSplit
from scalelab.tracking import Tracker
from scalelab.training import workloads

PROMPT_TOKENS = 16  # of each validation document, for the samples logged during training
NUM_SAMPLES = 2


def load_model(path: str | Path) -> tuple[workloads.Workload, dict[str, Any]]:
    """The workload of a `model.pt` or `best.pt`, its model holding the file's weights (CPU, eval
    mode), and the rest of the file (`workload`, `model_config`, ..., `best` in best.pt)."""
    try:  # tensors and plain values only: a pickled object in the file never runs
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0]
        raise DataError(f"{path} holds pickled objects, not only weights; refused to load it ({first})") from None
    wl = workloads.load(
        blob["workload"], blob["model_config"], input_shape=blob["input_shape"], num_classes=blob["num_classes"]
    )
    wl.model.load_state_dict(blob.pop("model"))
    wl.model.eval()
    return wl, blob


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompts: torch.Tensor,
    num_tokens: int,
    *,
    seq_len: int,
    temperature: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Prompts (batch, time) of token ids followed by `num_tokens` sampled ones; the model sees the
    last `seq_len` tokens. Temperature 0 takes the likeliest token. The model's mode is restored."""
    was_training = model.training
    model.eval()
    out = prompts
    for _ in range(num_tokens):
        logits = model(out[:, -seq_len:])[:, -1, :].float()
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1).cpu()
            nxt = torch.multinomial(probs, 1, generator=generator).to(out.device)
        else:
            nxt = logits.argmax(dim=-1, keepdim=True)
        out = torch.cat([out, nxt], dim=1)
    model.train(was_training)
    return out


def decode(tokens: torch.Tensor | np.ndarray) -> str:
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def sample_text(wl: workloads.Workload, prompt: str, num_tokens: int, temperature: float, seed: int) -> str:
    """The prompt and `num_tokens` tokens sampled after it, as text."""
    ids = list(prompt.encode()) or [ord("\n")]
    if max(ids) >= wl.config.vocab_size:
        raise DataError(f"--prompt: byte {max(ids)} is outside the model's vocab_size {wl.config.vocab_size}")
    prompts = torch.tensor([ids], dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    out = generate(wl.model, prompts, num_tokens, seq_len=wl.seq_len, temperature=temperature, generator=generator)
    return decode(out[0])


def log_samples(
    model: torch.nn.Module,
    split: TokenSplit,
    seq_len: int,
    num_tokens: int,
    step: int,
    seed: int,
    device: torch.device,
    tracker: Tracker,
) -> None:
    """Every rank calls it (a sharded model's forward is a collective), with the same prompts and
    generator, so every rank samples the same tokens; rank 0's tracker logs them. Its generator is
    its own: the training RNG streams are untouched, and a resumed run stays bitwise."""
    tokens = split.arrays["tokens"]
    starts = [int(s) for s in split.arrays["doc_starts"][:NUM_SAMPLES] if int(s) + PROMPT_TOKENS <= len(tokens)]
    if not starts:  # no document holds a whole prompt
        return
    prompts = torch.tensor(np.stack([tokens[s : s + PROMPT_TOKENS] for s in starts]).astype(np.int64), device=device)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    out = generate(model, prompts, num_tokens, seq_len=seq_len, temperature=1.0, generator=generator).cpu()
    text = "".join(
        f"--- sample {i} (prompt: the first {PROMPT_TOKENS} tokens of validation document {i})\n{decode(row)}\n"
        for i, row in enumerate(out)
    )
    tracker.log_text(text, f"samples/step-{step:06d}.txt")
