"""The MLflow run of a training job: rank 0 opens it (or resumes an interrupted job's run) with its
name, tags, params and provenance (training.run_record), and ends it with its final status.
Every other rank holds a no-op tracker."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from scalelab.config import Params
from scalelab.runtime import dist
from scalelab.runtime.device import tf32_tags
from scalelab.tracking import MlflowTracker, NullTracker, Tracker, UnsentMetrics, provenance
from scalelab.training.checkpoint import Checkpointer
from scalelab.training.run_record import log_resumed_params, log_run_inputs, run_name

log = logging.getLogger(__name__)


def open_tracker(
    params: Params,
    env: dist.DistEnv,
    ckpt: Checkpointer,
    device: torch.device,
    data_dir: str | Path,
    out: Path,
    resume_source: Path | None = None,
) -> Tracker:
    """Rank 0 opens (or resumes) the job's MLflow run; every other rank gets a no-op tracker.
    `resume_source` (train.resume_from) is kept when older checkpoint sets are pruned."""
    nodes = dist.all_gather_object(provenance.node_info())  # every rank: host name and GPUs
    tracker: Tracker = NullTracker()
    if env.is_main:
        old_run = ckpt.claim(keep=resume_source)
        if params.tracking.enabled:
            tags = {
                "scalelab.kind": "train",
                "scalelab.strategy": params.train.strategy,
                "scalelab.workload": params.train.workload,
                "scalelab.device": device.type,
                **tf32_tags(device.type),
                **provenance.dvc_info(),
            }
            tracker = MlflowTracker.open(
                params.tracking.experiment,
                run_name=run_name(params, env.world_size),
                tags=tags,
                run_id=old_run or params.tracking.run_id or None,
            )
            ckpt.record(tracker.run_id)  # from here on, `scalelab train` can close the run if this rank dies
            try:
                if old_run is None:
                    if params.tracking.run_id:  # a run made in advance (sweep element): tag it here
                        tracker.set_tags(tags)
                    log_run_inputs(tracker, params, env, nodes, data_dir)
                else:  # a resumed job: record where and how often it restarted, and what changed
                    tracker.set_tags({**provenance.launcher_info(), **provenance.dvc_info()})
                    log_resumed_params(tracker, params)
                    tracker.skip_stored()
            except BaseException:
                close(tracker, "FAILED", out)  # the run exists: it must not stay RUNNING
                raise
        else:
            ckpt.record(None)
    dist.barrier()  # the checkpoint folder is settled before any rank reads it
    return tracker


def close(tracker: Tracker, status: str, out: Path) -> None:
    """Ends the run of a failing job: metrics the store will not take go to a file, named in a
    log line, and the job's own error is the one raised."""
    try:
        tracker.finish(status, spill_dir=out)
    except UnsentMetrics as exc:
        log.error("%s", exc)
