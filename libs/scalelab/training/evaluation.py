"""Evaluation: loss and accuracy of a model over a split, and the `evaluate` stage, which scores
the trained model on the test split -> results/eval/metrics.json and the training run."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch

from scalelab.config import Params
from scalelab.data.store import DataError, load_split, verify
from scalelab.runtime import dist
from scalelab.runtime.io import atomic_write_json
from scalelab.tracking import MlflowTracker
from scalelab.training import workloads
from scalelab.training.plan import MODEL_FILE, RUN_FILE


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    wl: workloads.Workload,
    x: torch.Tensor,
    y: torch.Tensor,
    env: dist.DistEnv,
    device: torch.device,
    batch_size: int = 1024,
) -> dict[str, float]:
    """Loss and accuracy over (x, y), sharded across ranks and summed exactly (no padding)."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    xs, ys = x[env.rank :: env.world_size], y[env.rank :: env.world_size]
    rows = -(-len(y) // env.world_size)  # the longest rank's share: every rank runs as many forwards
    for i in range(0, rows, batch_size):  # (an fsdp model gathers its weights in each one)
        xb, yb = xs[i : i + batch_size].to(device), ys[i : i + batch_size].to(device)
        m = wl.metrics(model(xb), yb)
        sums += torch.stack(
            [m["loss_sum"].double(), m["correct"].double(), torch.tensor(len(yb), dtype=torch.float64, device=device)]
        )
    model.train(was_training)
    if env.world_size > 1:
        dist.all_reduce_sum(sums)
    loss_sum, correct, count = sums.tolist()
    return {"loss": loss_sum / max(count, 1), "accuracy": correct / max(count, 1)}


def run(params: Params, data_dir: str | Path, train_dir: str | Path, out_file: str | Path) -> dict[str, Any]:
    """Scores the trained model on the test split, writes `out_file`, logs into the train run."""
    verify(data_dir)
    train_dir = Path(train_dir)
    model_path = train_dir / MODEL_FILE
    if not model_path.is_file():
        raise FileNotFoundError(f"{model_path} is missing; run `dvc repro train` first")
    try:  # tensors and plain values only: a pickled object in the file (e.g. from a shared remote) never runs
        blob = torch.load(model_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0]
        raise DataError(f"{model_path} holds pickled objects, not only weights; refused to load it ({first})") from None
    wl = workloads.load(
        blob["workload"], blob["model_config"], input_shape=blob["input_shape"], num_classes=blob["num_classes"]
    )
    wl.model.load_state_dict(blob["model"])
    x, y = load_split(data_dir, "test")
    scores = evaluate(wl.model, wl, x, y, dist.DistEnv(), torch.device("cpu"), params.evaluate.batch_size)
    metrics = {"test_loss": scores["loss"], "test_accuracy": scores["accuracy"], "num_test_samples": len(y)}
    atomic_write_json(out_file, metrics)
    run_info = json.loads((train_dir / RUN_FILE).read_text())
    if params.tracking.enabled and run_info.get("run_id"):
        tracker = MlflowTracker.attach(run_info["run_id"])
        tracker.log_metrics({"test_loss": metrics["test_loss"], "test_accuracy": metrics["test_accuracy"]}, 0)
        tracker.finish(status=None, spill_dir=Path(out_file).parent)  # or raises UnsentMetrics naming the file
        tracker.log_artifact(out_file, "eval")
    return {**metrics, "run_id": run_info.get("run_id")}
