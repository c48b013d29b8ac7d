"""Evaluation: the final model on the test split -> results/eval/metrics.json and the train run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from scalelab import data, dist, engine, tracking, workloads
from scalelab.io import atomic_write_json
from scalelab.params import Params
from scalelab.train import MODEL_FILE, RUN_FILE


def run(params: Params, data_dir: str | Path, train_dir: str | Path, out_file: str | Path) -> dict[str, Any]:
    """Scores the trained model on the test split, writes `out_file`, logs into the train run."""
    data.verify(data_dir)
    train_dir = Path(train_dir)
    model_path = train_dir / MODEL_FILE
    if not model_path.is_file():
        raise FileNotFoundError(f"{model_path} is missing; run `dvc repro train` first")
    blob = torch.load(model_path, map_location="cpu", weights_only=False)
    wl = workloads.load(blob["workload"], blob["model_config"], input_shape=blob["input_shape"],
                        num_classes=blob["num_classes"])
    wl.model.load_state_dict(blob["model"])
    x, y = data.load_split(data_dir, "test")
    scores = engine.evaluate(wl.model, wl, x, y, dist.DistEnv(), torch.device("cpu"),
                             params.evaluate.batch_size)
    metrics = {"test_loss": scores["loss"], "test_accuracy": scores["accuracy"], "num_test_samples": len(y)}
    atomic_write_json(out_file, metrics)
    run_info = json.loads((train_dir / RUN_FILE).read_text())
    if params.tracking.enabled and run_info.get("run_id"):
        tracker = tracking.MlflowTracker.attach(run_info["run_id"])
        tracker.log_metrics({"test_loss": metrics["test_loss"], "test_accuracy": metrics["test_accuracy"]}, 0)
        tracker.log_artifact(out_file, "eval")
        tracker.flush()
    return {**metrics, "run_id": run_info.get("run_id")}
