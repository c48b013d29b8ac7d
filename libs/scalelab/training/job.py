"""One training job on every rank: process set-up, the MLflow run, the trainer, and the job's end.

`run()` is what each process executes (under torchrun, srun or alone), with the params and run
plan that `scalelab train` resolved once. Global rank 0 alone writes shared files and talks to
MLflow; the others hold a no-op tracker (training.run_tracking). Rank 0 broadcasts the run id, and
local rank 0 of every node logs that node's system metrics into it (scalelab.tracking.sysmetrics).
The loop, its cadences and what a checkpoint holds are training.trainer, training.callbacks and
training.checkpoint_parts. Whatever ends the job, the run gets a final status: FINISHED, KILLED
(SIGTERM, Ctrl-C, a preemption stop) or FAILED (any other exception), after the buffered metrics
are flushed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalelab.config import Params
from scalelab.data.store import verify
from scalelab.runtime import dist
from scalelab.runtime.device import setup_process
from scalelab.runtime.io import atomic_write_text
from scalelab.runtime.signals import StopFlag
from scalelab.runtime.timings import mark
from scalelab.tracking import sysmetrics
from scalelab.training import outputs, profiling
from scalelab.training.callbacks import NonFiniteLossError  # noqa: F401 (re-exported)
from scalelab.training.checkpoint import Checkpointer, fingerprint
from scalelab.training.checkpoint_parts import PENDING_KEY, WINDOW_KEY  # noqa: F401 (re-exported)
from scalelab.training.plan import RunPlan
from scalelab.training.resume_from import resume_source
from scalelab.training.run_tracking import close, open_tracker
from scalelab.training.trainer import Trainer, build, build_workload  # noqa: F401 (build_workload: re-exported)

LOCATION_FILE = "location.txt"  # in <out>/checkpoints when train.checkpoint_dir puts them elsewhere


def run(
    params: Params, plan: RunPlan, data_dir: str | Path, out_dir: str | Path, stop: StopFlag | None = None
) -> dict[str, Any]:
    """Trains to the end (or to a stop signal) and returns the summary (meaningful on rank 0)."""
    env = dist.read_env()
    t = params.train
    device = setup_process(
        env,
        device=t.device,
        threads=t.threads_per_process,
        deterministic=t.deterministic,
        timeout_s=t.collective_timeout_s,
    )
    mark("process_group")  # joined: torchrun's rendezvous and init_process_group are done
    out = Path(out_dir)
    manifest = verify(data_dir)
    ckpt = Checkpointer(  # train.checkpoint_dir: this disk, or a store (checked before launch)
        plan.checkpoints or out / "checkpoints",
        fingerprint(t, manifest),
        keep=t.keep_checkpoints,
        asynchronous=t.async_checkpoint,
    )
    if env.is_main and plan.checkpoints and Path(plan.checkpoints) != out / "checkpoints":
        # DVC's persisted output <out>/checkpoints says where they went (a folder or the store)
        atomic_write_text(out / "checkpoints" / LOCATION_FILE, f"{plan.checkpoints}\n")
    if env.is_main and t.profile.enabled:
        profiling.clear(out / "profile")  # an earlier run's traces must not be logged with this one
    source = resume_source(t.resume_from)
    tracker = open_tracker(params, env, ckpt, device, data_dir, out, source)
    mark("run_created")  # the MLflow run with its params, tags and provenance artifacts
    monitor = sysmetrics.NodeMonitor(None)
    try:
        monitor = sysmetrics.start(
            dist.broadcast_object(tracker.run_id), env, params.tracking.system_metrics_interval_s
        )
        mark("monitor_started")
        trainer = build(params, plan, env, device, manifest, data_dir, out, ckpt, tracker, stop, source)
        trainer.fit()
        summary = finish(params, trainer, manifest, out, ckpt)
    except BaseException as exc:
        monitor.stop()
        close(tracker, "KILLED" if isinstance(exc, (SystemExit, KeyboardInterrupt)) else "FAILED", out)
        raise
    monitor.stop()
    mark("final_flush")
    tracker.finish("FINISHED" if not summary.get("preempted") else "KILLED", spill_dir=out)
    mark("finished")
    return summary


def finish(params: Params, trainer: Trainer, manifest: dict[str, Any], out: Path, ckpt: Checkpointer) -> dict[str, Any]:
    """The job's end on every rank: the summary with each rank's weight digest, and (rank 0, unless
    preempted) the outputs in results/train; a finished job's checkpoints never resume."""
    summary, env, tracker = trainer.summary(), trainer.env, trainer.tracker
    weights = trainer.loop.strategy.model_state(trainer.loop.model)  # under fsdp gathered to rank 0 alone
    # each ddp rank's copy must agree; fsdp holds one copy, in shards: the digest of the gathered one
    digest = outputs.weights_digest(weights)
    sharded = trainer.loop.strategy.sharded
    summary["rank_weight_sha256"] = [digest] if sharded else dist.all_gather_object(digest)
    if env.is_main and not summary["preempted"]:
        outputs.write_outputs(params, weights, manifest, out, summary, tracker, env, ckpt)
        ckpt.record(tracker.run_id, finished=True)  # a rerun trains anew: a finished job never resumes
    dist.barrier()
    mark("outputs_written")
    return summary
