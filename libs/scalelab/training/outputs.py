"""What a training job leaves in results/train/: `model.pt` (the last weights), `best.pt` (the
weights at the best `train.best_metric`, kept in checkpoints/ as training goes: `BestWeights`;
when no validation gave a finite value, the last weights, marked with the reason, which
`evaluate.checkpoint: best` refuses), `metrics.json` and `run.json`; and their figures and tags in
the run. Global rank 0 writes them."""

from __future__ import annotations

import hashlib
import io
import logging
from pathlib import Path
from typing import Any

import torch

from scalelab.config import Params
from scalelab.runtime import dist
from scalelab.runtime.io import atomic_write_bytes, atomic_write_json, file_digests
from scalelab.tracking import Tracker
from scalelab.training import profiling
from scalelab.training.best import Best
from scalelab.training.checkpoint import Checkpointer
from scalelab.training.loop import Loop
from scalelab.training.plan import BEST_FILE, METRICS_FILE, MODEL_FILE, RUN_FILE

log = logging.getLogger(__name__)
RUN_MEANS = {"samples_per_s": "mean_samples_per_s", "step_time_ms": "mean_step_time_ms"}  # MLflow keys, whole run


class BestWeights:
    """The weights at the best validation value so far, serialized in memory on global rank 0 at
    each improvement and written to `checkpoints/best.pt` with the next checkpoint and at the end,
    so a checkpoint and the best.pt beside it agree (a resumed job recomputes the same steps and
    finds the same improvements) without a disk write per validation."""

    def __init__(self, params: Params, manifest: dict[str, Any], ckpt: Checkpointer) -> None:
        self.params, self.manifest, self.files = params, manifest, ckpt.files  # beside the checkpoints
        self.unwritten: bytes | None = None

    def keep(self, loop: Loop, env: dist.DistEnv, best: Best) -> None:
        """Every rank calls it at an improvement: under fsdp the weights are gathered to rank 0."""
        weights = loop.strategy.model_state(loop.model)
        if env.is_main:
            extra = {"best": {"metric": best.metric, "value": best.value, "step": best.step}}
            self.unwritten = model_file(self.params, weights, self.manifest, extra)  # a copy, taken now

    def write(self) -> None:
        """Writes the kept weights, if newer than the file (rank 0)."""
        if self.unwritten is not None:
            self.files.write(BEST_FILE, self.unwritten)
            self.unwritten = None


def model_file(params: Params, weights: dict[str, torch.Tensor], manifest: dict[str, Any], extra=None) -> bytes:
    """The bytes of `model.pt` or `best.pt`: the weights and what `evaluate` needs to rebuild the model."""
    buf = io.BytesIO()
    torch.save(
        {
            "model": weights,
            "workload": params.train.workload,
            "model_config": params.train.model,
            "input_shape": manifest["input_shape"],
            "num_classes": manifest["num_classes"],
            **(extra or {}),
        },
        buf,
    )
    return buf.getvalue()


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over a model state dict (parameters and buffers): equal digests mean equal weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def output_hashes(out: Path) -> dict[str, str]:
    """`outputs.<file>.md5` and `.sha256` of model.pt and best.pt: the md5 is DVC's name for the
    file in the store, so `scalelab fetch RUN_ID` gets this run's weights back and checks them."""
    tags = {}
    for name in (MODEL_FILE, BEST_FILE):
        md5, sha256 = file_digests(out / name, "md5", "sha256")
        tags |= {f"outputs.{name}.md5": md5, f"outputs.{name}.sha256": sha256}
    return tags


def no_best_reason(metric: str, summary: dict[str, Any]) -> str:
    """Why a job that trained to its end has no best weights: no validation value was finite, or
    it stopped before its first validation."""
    if summary.get(f"best_{metric}") is None:
        return f"no best weights: no validation gave a finite {metric} (or none ran)"
    return f"no best weights: the weights of the best {metric} (step {summary.get('best_step')}) were not kept"


def write_outputs(
    params: Params,
    weights: dict[str, torch.Tensor],
    manifest: dict[str, Any],
    out: Path,
    summary: dict[str, Any],
    tracker: Tracker,
    env: dist.DistEnv,
    ckpt: Checkpointer,
) -> None:
    atomic_write_bytes(out / MODEL_FILE, model_file(params, weights, manifest))
    best_weights = None  # best.pt holds the best weights; else why it holds the last ones
    if ckpt.files.is_file(BEST_FILE):  # kept beside the checkpoints (BestWeights)
        atomic_write_bytes(out / BEST_FILE, ckpt.files.read(BEST_FILE))
    else:
        best_weights = no_best_reason(params.train.best_metric, summary)
        log.warning("%s: best.pt holds the last weights (step %d), marked as such", best_weights, summary["step"])
        extra = {"best": {"metric": params.train.best_metric, "value": None, "step": None, "reason": best_weights}}
        atomic_write_bytes(out / BEST_FILE, model_file(params, weights, manifest, extra))
    digests = summary["rank_weight_sha256"]
    best_keys = [k for k in summary if k.startswith("best_") and summary[k] is not None]
    metrics = {k: summary[k] for k in ("samples_per_s", "step_time_ms", *best_keys) if k in summary}
    metrics["ranks_in_sync"] = float(len(set(digests)) == 1)
    atomic_write_json(out / METRICS_FILE, {**metrics, "steps": summary["step"]})
    atomic_write_json(
        out / RUN_FILE,
        {
            "run_id": tracker.run_id,
            "experiment": params.tracking.experiment,
            "rank_weight_sha256": digests,
            "stop_reason": summary["stop_reason"],
        },
    )
    # the whole run's means get their own keys: step `total` also holds the last window's figures
    tracker.log_metrics({RUN_MEANS.get(k, k): v for k, v in metrics.items()}, summary["step"])
    tracker.set_tags(
        {
            **output_hashes(out),
            "weights.sha256": digests[0],
            "weights.ranks_in_sync": str(len(set(digests)) == 1).lower(),
            "scalelab.stop_reason": summary["stop_reason"],
            **({"scalelab.best_weights": best_weights} if best_weights else {}),
            **({"scalelab.pruned_step": summary["step"]} if summary["stop_reason"] == "pruned" else {}),
        }
    )
    tracker.log_artifact(out / METRICS_FILE)
    if params.train.profile.enabled:
        profiling.log_artifacts(tracker, out / "profile", env.world_size, summary["step"])
