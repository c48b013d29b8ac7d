"""Evaluation: loss and the workload's scores over a split, and the `evaluate` stage, which scores
the trained model on the test split -> results/eval/metrics.json and the training run.

A classifier is scored by loss and accuracy; a language model (a token split) by loss per token,
perplexity (e ** loss) and bits per byte (loss / ln 2, per byte of text the tokens cover).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalelab.config import ConfigError, Params
from scalelab.config.schema import SCORES
from scalelab.data.store import Split, open_split, verify
from scalelab.runtime import dist
from scalelab.runtime.io import atomic_write_json
from scalelab.tracking import MlflowTracker
from scalelab.training import workloads
from scalelab.training.plan import BEST_FILE, MODEL_FILE, RUN_FILE
from scalelab.training.sampling import load_model

# the names the scores of each kind of data (config.schema.SCORES) go by in the test metrics
TEST_NAMES = {
    "loss": "test_loss",
    "accuracy": "test_accuracy",
    "perplexity": "perplexity",
    "bits_per_byte": "bits_per_byte",
}


def named(scores: dict[str, float], kind: str, split: str) -> dict[str, float]:
    """The metrics of this kind of data under their names: `val_<score>` for the val split (every
    epoch's end); test_loss and test_accuracy, or test_loss, perplexity and bits_per_byte for test."""
    return {TEST_NAMES[s] if split == "test" else f"{split}_{s}": scores[s] for s in SCORES[kind]}


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    wl: workloads.Workload,
    split: Split,
    env: dist.DistEnv,
    device: torch.device,
    batch_size: int = 1024,
) -> dict[str, float]:
    """Scores over `split`, sharded across ranks (rank r takes samples r, r + W, ...) and summed
    exactly (no padding); every rank runs as many forwards (an fsdp model gathers its weights in each)."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    n, world = len(split), env.world_size
    mine = max(n - env.rank + world - 1, 0) // world  # this rank's samples
    rows = -(-n // world)  # the longest rank's share
    for i in range(0, rows, batch_size):
        local = np.arange(min(i, mine), min(i + batch_size, mine), dtype=np.int64)
        xb, yb = split.fetch(local * world + env.rank)
        m = wl.metrics(model(xb.to(device)), yb.to(device))
        count = m.get("count", torch.tensor(len(yb)))
        sums += torch.stack([m["loss_sum"].double(), m["correct"].double(), count.double().to(device)])
    model.train(was_training)
    if world > 1:
        dist.all_reduce_sum(sums)
    loss_sum, correct, count = sums.tolist()
    loss = loss_sum / max(count, 1)
    scores = {"loss": loss, "accuracy": correct / max(count, 1)}
    if split.kind == "tokens":
        scores["perplexity"] = math.exp(min(loss, 700.0))  # e ** 700 is near float64's largest
        scores["bits_per_byte"] = loss / math.log(2) / split.bytes_per_token
    return scores


def run(params: Params, data_dir: str | Path, train_dir: str | Path, out_file: str | Path) -> dict[str, Any]:
    """Scores the trained model on the test split, writes `out_file`, logs into the train run."""
    manifest = verify(data_dir)
    train_dir = Path(train_dir)
    model_path = train_dir / (BEST_FILE if params.evaluate.checkpoint == "best" else MODEL_FILE)
    if not model_path.is_file():
        raise FileNotFoundError(f"{model_path} is missing; run `dvc repro train` first")
    wl, blob = load_model(model_path)  # tensors and plain values only: a pickled object in the file never runs
    if params.evaluate.checkpoint == "best" and "best" in blob and blob["best"].get("value") is None:
        raise ConfigError(  # train found none (training.outputs.no_best_reason)
            f"evaluate.checkpoint = 'best' is not allowed for this training: {blob['best'].get('reason')} "
            f"({model_path} holds the last weights); set evaluate.checkpoint: last"
        )
    split = open_split(data_dir, "test", manifest, seq_len=wl.seq_len)
    scores = evaluate(wl.model, wl, split, dist.DistEnv(), torch.device("cpu"), params.evaluate.batch_size)
    scored = named(scores, split.kind, "test")
    metrics = {**scored, "num_test_samples": len(split)}
    if "best" in blob:  # best.pt: the step and validation value it was kept for
        metrics["checkpoint_step"] = blob["best"]["step"]
    atomic_write_json(out_file, metrics)
    run_info = json.loads((train_dir / RUN_FILE).read_text())
    if params.tracking.enabled and run_info.get("run_id"):
        tracker = MlflowTracker.attach(run_info["run_id"])
        tracker.log_metrics(scored, 0)
        tracker.finish(status=None, spill_dir=Path(out_file).parent)  # or raises UnsentMetrics naming the file
        tracker.log_artifact(out_file, "eval")
    return {**metrics, "run_id": run_info.get("run_id")}
