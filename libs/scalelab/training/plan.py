"""The run plan: the job's arithmetic, computed once before anything launches.

`scalelab train` computes it from params and the prepared data's manifest, refuses a job that does
not fit (a ConfigError, exit 2, before torchrun or sbatch), and writes it with the params into the
output folder (`resolved.json`). Every rank, local or on SLURM, reads that one file back: nothing
downstream recomputes world size, batches or step counts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scalelab.config import ConfigError, Params, TrainConfig, parse_params, to_dict
from scalelab.runtime.io import atomic_write_json

# the files of a training job's output folder
RESOLVED_FILE = "resolved.json"  # params and plan, written before launch, read by every rank
RUN_FILE = "run.json"  # the MLflow run id, read by evaluate
MODEL_FILE = "model.pt"
BEST_FILE = "best.pt"  # the weights at the best value of train.best_metric
METRICS_FILE = "metrics.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPlan:
    world_size: int  # processes taking part (1 for single and dp)
    per_rank_batch: int  # samples per rank per micro-step (train.batch_size)
    grad_accum_steps: int
    global_batch: int  # samples per optimizer step, all ranks together
    steps_per_epoch: int  # optimizer steps per epoch (DistributedSampler, drop_last)
    total_steps: int
    checkpoints: str = ""  # train.checkpoint_dir resolved: a folder or a URL ("": <out>/checkpoints)

    @classmethod
    def of(cls, train: TrainConfig, num_train_samples: int) -> RunPlan:
        """The plan of `train` on a training split of `num_train_samples`.

        Raises:
            ConfigError: the global batch is larger than the training split.
        """
        world, global_batch = train.world_size, train.global_batch
        per_rank_samples = num_train_samples // world  # DistributedSampler(drop_last=True)
        steps = per_rank_samples // (train.batch_size * train.grad_accum_steps)
        if steps == 0:
            raise ConfigError(
                f"train.batch_size = {train.batch_size} is too large: x grad_accum_steps "
                f"{train.grad_accum_steps} x world size {world} = {global_batch} samples per "
                f"step, but the training split has {num_train_samples}; lower train.batch_size"
            )
        return cls(
            world_size=world,
            per_rank_batch=train.batch_size,
            grad_accum_steps=train.grad_accum_steps,
            global_batch=global_batch,
            steps_per_epoch=steps,
            total_steps=train.epochs * steps,
        )


def write_resolved(out_dir: str | Path, params: Params, plan: RunPlan) -> Path:
    """Writes the params and the plan that every rank of the job reads; returns the path."""
    path = Path(out_dir) / RESOLVED_FILE
    atomic_write_json(path, {"params": to_dict(params), "plan": asdict(plan)})
    return path


def read_resolved(path: str | Path) -> tuple[Params, RunPlan]:
    """The params and plan written by `write_resolved`."""
    raw: dict[str, Any] = json.loads(Path(path).read_text())
    return parse_params(raw["params"], str(path)), RunPlan(**raw["plan"])
