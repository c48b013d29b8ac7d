"""One training job on every rank: resume, loop, checkpoint, track, write results/train/.

`run()` is what each process executes (under torchrun, srun or alone), with the params and run
plan that `scalelab train` resolved once. Global rank 0 alone writes shared files and talks to
MLflow; the others hold a no-op tracker. Rank 0 broadcasts the run id, and local rank 0 of every
node logs that node's system metrics into it (scalelab.tracking.sysmetrics).
Whatever ends the job, the run gets a final status: FINISHED, KILLED (SIGTERM, Ctrl-C, a
preemption stop) or FAILED (any other exception), after the buffered metrics are flushed.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from scalelab.config import Params
from scalelab.data.store import open_split, verify
from scalelab.runtime import dist, seeds
from scalelab.runtime.device import setup_process, tf32_tags
from scalelab.runtime.io import atomic_write_text
from scalelab.runtime.signals import StopFlag
from scalelab.runtime.timings import mark
from scalelab.tracking import MlflowTracker, NullTracker, Tracker, UnsentMetrics, provenance, sysmetrics
from scalelab.training import outputs, profiling, sampling, schedule, strategy, workloads
from scalelab.training.best import Best
from scalelab.training.checkpoint import Checkpointer, checkpoint_state, fingerprint, restore
from scalelab.training.evaluation import evaluate, named
from scalelab.training.loader import RunLoader
from scalelab.training.loop import Loop, Optim, build_loop
from scalelab.training.meter import Meter
from scalelab.training.plan import RunPlan
from scalelab.training.pruning import Pruning
from scalelab.training.resume_from import load_resume_source, restore_resumed, resume_source
from scalelab.training.run_record import log_resumed_params, log_run_inputs, run_name

log = logging.getLogger(__name__)
PENDING_KEY = "pending_metrics"  # checkpoint entry: metrics not yet confirmed stored in MLflow
LOCATION_FILE = "location.txt"  # in <out>/checkpoints when train.checkpoint_dir puts them elsewhere
WINDOW_KEY = "meter_window"  # checkpoint entry: every rank's open logging window (training.meter)


class NonFiniteLossError(RuntimeError):
    """The training loss is NaN or infinite: the job stops, FAILED, and keeps its good checkpoints."""

    def __init__(self, value: float, step: int, ckpt: Checkpointer) -> None:
        last = ckpt.steps()[:1]
        super().__init__(
            f"train_loss = {value} at step {step} is not finite: training diverged; the newest "
            f"checkpoint stays step {last[0] if last else 'none'}; lower train.lr or use precision fp32"
        )


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
        summary = _train(params, plan, env, device, manifest, data_dir, out, ckpt, tracker, stop, source)
    except BaseException as exc:
        monitor.stop()
        close(tracker, "KILLED" if isinstance(exc, (SystemExit, KeyboardInterrupt)) else "FAILED", out)
        raise
    monitor.stop()
    mark("final_flush")
    tracker.finish("FINISHED" if not summary.get("preempted") else "KILLED", spill_dir=out)
    mark("finished")
    return summary


def close(tracker: Tracker, status: str, out: Path) -> None:
    """Ends the run of a failing job: metrics the store will not take go to a file, named in a
    log line, and the job's own error is the one raised."""
    try:
        tracker.finish(status, spill_dir=out)
    except UnsentMetrics as exc:
        log.error("%s", exc)


def _train(
    params: Params,
    plan: RunPlan,
    env: dist.DistEnv,
    device: torch.device,
    manifest: dict[str, Any],
    data_dir: str | Path,
    out: Path,
    ckpt: Checkpointer,
    tracker: Tracker,
    stop: StopFlag | None,
    source: Path | None = None,
) -> dict[str, Any]:
    train = params.train
    seq_len = workloads.seq_len(train.workload, train.model)
    data, val_split = (open_split(data_dir, name, manifest, seq_len=seq_len) for name in ("train", "val"))
    loader = RunLoader(data, plan, env, seed=train.seed, num_workers=train.num_workers)  # memory-mapped
    mark("data_loaded")
    state = ckpt.load_latest()
    resumed_from = None  # train.resume_from's checkpoint, when this job starts from it
    if state is None and source is not None:
        state = resumed_from = load_resume_source(source, ckpt, env)
    wl, init_state = build_workload(params, manifest, env, resuming_shards=bool(state and "shards" in state))
    optim = Optim(name=train.optimizer, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    total, per_epoch, accum = plan.total_steps, plan.steps_per_epoch, plan.grad_accum_steps
    lr_schedule = functools.partial(
        schedule.build,
        total_steps=total,
        schedule=train.lr_schedule,
        warmup_steps=train.lr_warmup_steps,
        min_ratio=train.min_lr_ratio,
        decay_fraction=train.lr_decay_fraction,
    )
    loop = build_loop(
        wl,
        device,
        strategy_name=train.strategy,
        precision=train.precision,
        optim=optim,
        schedule=lr_schedule,
        clip_norm=train.grad_clip_norm,
        activation_checkpointing=train.activation_checkpointing,
        init_state=init_state,
        num_devices=train.nproc_per_node,
    )
    best = Best(train.best_metric, train.best_mode, train.early_stop_patience)
    parts = {"best": best}  # the job's stateful parts beyond the loop's (Loop.stateful)
    best_weights = outputs.BestWeights(params, manifest, ckpt)
    if resumed_from is None:
        step = restore(state, loop, train.seed, env, parts)
        tracker.replay_metrics((state or {}).get(PENDING_KEY, []))  # those the killed try may not have stored
    else:  # on purpose, from a checkpoint of other params, data or code (its metrics stay in its run)
        step = restore_resumed(resumed_from, source, ckpt, loop, train.seed, env, parts, tracker)
    if state:  # the run says it went on from a checkpoint (the newest resume, if several)
        tracker.set_tags({"scalelab.resumed_from_step": step})
    meter = Meter(train.untimed_steps + step, plan.global_batch)
    windows = (state or {}).get(WINDOW_KEY, [])
    meter.load_window(windows[env.rank] if len(windows) == env.world_size else None, device)  # none at a new size
    mark("model_built")  # model, optimizer, strategy wrapper and the checkpoint (if any) restored
    first_step = step + 1
    bar = tqdm(
        total=total,
        initial=step,
        disable=not env.is_main,
        file=sys.stderr,
        mininterval=1.0 if sys.stderr.isatty() else 10.0,
        desc=run_name(params, env.world_size) if env.is_main else None,  # the name reads git: rank 0 only
    )
    stopped = early_stop = pruned = False
    pruning = Pruning.of(out)  # a search trial: its pruner may stop it at a validation
    with profiling.profiler(train.profile, out / "profile", env.rank) as prof:
        while step < total and not (stopped or early_stop or pruned):
            epoch = step // per_epoch
            batches = loader.epoch(epoch, skip_batches=(step - epoch * per_epoch) * accum)
            for _ in range(step - epoch * per_epoch, per_epoch):
                logging_step = (step + 1) % train.log_every_steps == 0 or step + 1 == total
                loss = loop.step([next(batches) for _ in range(accum)], measure_norm=logging_step)
                step += 1
                if step == first_step:
                    mark("first_step")  # this process's first (a resumed job's too)
                prof.step()
                meter.add(step, loss)
                bar.update(1)
                if logging_step:
                    window = {**meter.window(step, device), "lr": loop.last["lr"]}
                    window["grad_norm"] = float(loop.last["grad_norm"])  # before clipping
                    tracker.log_metrics(window, step)
                    if not math.isfinite(window["train_loss"]):  # the same value on every rank
                        raise NonFiniteLossError(window["train_loss"], step, ckpt)
                    bar.set_postfix(
                        loss=f"{window['train_loss']:.4f}",
                        samples_s=f"{window.get('samples_per_s', 0):,.0f}",
                        refresh=False,
                    )
                if step % per_epoch == 0:
                    val = named(evaluate(loop.model, loop.workload, val_split, env, device), val_split.kind, "val")
                    tracker.log_metrics(val, step)
                    if val_split.kind == "tokens" and train.sample_tokens:  # every rank: fsdp's forward
                        sampling.log_samples(
                            loop.model, val_split, seq_len, train.sample_tokens, step, train.seed, device, tracker
                        )
                    if best.update(val, step):  # every rank: the same all-reduced values
                        best_weights.keep(loop, env, best)
                    early_stop = best.should_stop and step < total
                    pruned = pruning is not None and step < total and pruning.should_prune(val, step // per_epoch, env)
                # every rank checks at the same steps: the check is an all-reduce (and a host sync)
                check = stop is not None and step % params.slurm.stop_check_every_steps == 0
                stopped = check and stop.everywhere(device)
                ended = stopped or early_stop or pruned
                if step % train.checkpoint_every_steps == 0 or step == total or ended:
                    if meter.window_steps and not meter.window_is_finite(device):
                        raise NonFiniteLossError(float("nan"), step, ckpt)  # never checkpoint it
                    if env.is_main:
                        best_weights.write()  # best.pt agrees with the checkpoint written next
                    _checkpoint(loop, meter, epoch, step, env, ckpt, tracker, parts)
                if ended:
                    break
    ckpt.wait()  # the last (asynchronous) checkpoint is committed before the job ends
    bar.close()
    loader.close()
    mark("last_step")
    if early_stop:
        log.info(
            "early stop at step %d of %d: %s has not improved for %d validations (best %s)",
            step,
            total,
            best.metric,
            best.since_better,
            f"{best.value:.6g} at step {best.step}" if best.value is not None else "none: no value was finite",
        )
    summary = {
        "step": step,
        "total_steps": total,
        "preempted": stopped,
        "stop_reason": "preempted" if stopped else "early_stop" if early_stop else "pruned" if pruned else "completed",
        "run_id": tracker.run_id,
        **meter.summary(),
        "best_step": best.step if best.value is not None else None,  # None: no validation value was finite
        f"best_{best.metric}": best.value,
    }
    weights = loop.strategy.model_state(loop.model)  # under fsdp gathered to rank 0 alone
    # each ddp rank's copy must agree; fsdp holds one copy, in shards: the digest of the gathered one
    digest = outputs.weights_digest(weights)
    summary["rank_weight_sha256"] = [digest] if loop.strategy.sharded else dist.all_gather_object(digest)
    if env.is_main and not stopped:
        outputs.write_outputs(params, weights, manifest, out, summary, tracker, env, ckpt)
        ckpt.record(tracker.run_id, finished=True)  # a rerun trains anew: a finished job never resumes
    dist.barrier()
    mark("outputs_written")
    return summary


def build_workload(
    params: Params, manifest: dict[str, Any], env: dist.DistEnv, resuming_shards: bool
) -> tuple[workloads.Workload, dict[str, torch.Tensor] | None]:
    """The workload, its model initialised from `train.seed` identically on every rank.

    Under a sharded strategy (fsdp) the model is built on the meta device (no memory) and sharded
    before it is materialised: the initial weights are made once, on rank 0's CPU, and each rank
    receives only its shards (`strategy.Strategy.wrap`); a job resuming from sharded checkpoints
    makes none. Returns the workload and that initial state ({} on the other ranks; None when
    there is none).
    """
    train = params.train
    build = functools.partial(
        workloads.load,
        train.workload,
        train.model,
        input_shape=manifest["input_shape"],
        num_classes=manifest["num_classes"],
    )
    seeds.seed_all(train.seed)
    if not strategy.get(train.strategy).sharded:
        return build(), None
    with torch.device("meta"):
        wl = build()
    if resuming_shards:
        return wl, None
    return wl, build().model.state_dict() if env.is_main else {}


def _checkpoint(
    loop: Loop,
    meter: Meter,
    epoch: int,
    step: int,
    env: dist.DistEnv,
    ckpt: Checkpointer,
    tracker: Tracker,
    parts: dict[str, Any],
) -> None:
    """Saves a checkpoint (rank 0) holding every rank's open metric window and the metrics MLflow
    has not yet confirmed.

    The metrics go to the background writer without waiting; those still unconfirmed are saved
    in the checkpoint, and a resume from it sends them again, so none is lost and none is logged
    twice (SQL stores drop exact duplicates).
    """
    tracker.flush(wait=False)
    state, shards = checkpoint_state(loop, epoch, tracker.run_id, parts)
    windows = dist.all_gather_object(meter.window_state())
    if env.is_main or shards is not None:  # sharded: every rank writes its own
        ckpt.save(step, {**state, WINDOW_KEY: windows, PENDING_KEY: tracker.pending_metrics()}, shards)
