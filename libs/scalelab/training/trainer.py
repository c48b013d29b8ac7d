"""The training loop of one rank: `build` makes a `Trainer` from the params and the run plan,
restores its checkpoint parts, and `Trainer.fit` steps to the end or to a stop.

`fit` runs `Loop.step` and then each callback that is due (training.callbacks: log, progress bar,
validate, best and early stop, prune, stop flag, checkpoint, profile). What a checkpoint holds is
the trainer's `parts` (training.checkpoint_parts), registered in `register_parts`: a new stateful
part is one line there. The job around it (process set-up, the tracker, outputs) is training.job.
"""

from __future__ import annotations

import functools
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scalelab.config import Params
from scalelab.data.store import open_split
from scalelab.runtime import dist, seeds
from scalelab.runtime.signals import StopFlag
from scalelab.runtime.timings import mark
from scalelab.tracking import Tracker
from scalelab.training import callbacks, outputs, schedule, strategy, workloads
from scalelab.training.best import Best
from scalelab.training.checkpoint import Checkpointer
from scalelab.training.checkpoint_parts import (
    PENDING_KEY,
    WINDOW_KEY,
    CheckpointParts,
    Counters,
    MeterWindow,
    PendingMetrics,
    Rng,
    StateDict,
    Weights,
)
from scalelab.training.loader import RunLoader
from scalelab.training.loop import Loop, Optim, build_loop
from scalelab.training.meter import Meter
from scalelab.training.plan import RunPlan
from scalelab.training.resume_from import load_resume_source, restore_resumed
from scalelab.training.run_record import run_name

STOP_REASONS = ("preempted", "early_stop", "pruned")  # when several stop one step, the first wins


@dataclass(kw_only=True)
class Trainer:
    """One rank's training state and its cadences (assigned once; `build` makes one)."""

    loop: Loop
    loader: RunLoader
    meter: Meter
    best: Best
    tracker: Tracker
    env: dist.DistEnv
    device: torch.device
    total_steps: int
    steps_per_epoch: int
    grad_accum_steps: int
    log_every_steps: int
    callbacks: list[callbacks.Callback] = field(default_factory=list)
    parts: CheckpointParts = field(default_factory=CheckpointParts)  # what a checkpoint holds
    step: int = 0  # optimizer steps done
    stop_reason: str | None = None  # set by a callback (`stop`); None while training goes on
    val: dict[str, float] = field(default_factory=dict)  # the last validation's metrics
    window: dict[str, float] = field(default_factory=dict)  # the last logged window's metrics

    def fit(self) -> str:
        """Trains from `step` to the last step or to a stop; returns why it ended ('completed',
        'preempted', 'early_stop' or 'pruned')."""
        per_epoch, accum, first_step = self.steps_per_epoch, self.grad_accum_steps, self.step + 1
        with ExitStack() as stack:
            for callback in self.callbacks:
                callback.begin(self, stack)
            while self.step < self.total_steps and self.stop_reason is None:
                epoch, done = divmod(self.step, per_epoch)
                batches = self.loader.epoch(epoch, skip_batches=done * accum)  # the sampler's position
                for _ in range(done, per_epoch):
                    micro_batches = [next(batches) for _ in range(accum)]
                    loss = self.loop.step(micro_batches, measure_norm=self.logs_at(self.step + 1))
                    self.step += 1
                    if self.step == first_step:
                        mark("first_step")  # this process's first (a resumed job's too)
                    self.meter.add(self.step, loss)
                    for callback in self.callbacks:
                        if callback.due(self):
                            callback.on_step(self)
                    if self.stop_reason is not None:
                        break
        for callback in self.callbacks:
            callback.end(self)
        self.loader.close()
        mark("last_step")
        return self.stop_reason or "completed"

    def logs_at(self, step: int) -> bool:
        """A logging step: its window is logged, with the gradient norm measured."""
        return step % self.log_every_steps == 0 or step == self.total_steps

    def stop(self, reason: str) -> None:
        """Ends training after this step (its checkpoint is still written); of several reasons
        at one step, the first of `STOP_REASONS` is kept."""
        if self.stop_reason is None or STOP_REASONS.index(reason) < STOP_REASONS.index(self.stop_reason):
            self.stop_reason = reason

    def summary(self) -> dict[str, Any]:
        """The job's figures (meaningful on rank 0): steps, why it stopped, throughput, the best value."""
        reason, best = self.stop_reason or "completed", self.best
        return {
            "step": self.step,
            "total_steps": self.total_steps,
            "preempted": reason == "preempted",
            "stop_reason": reason,
            "run_id": self.tracker.run_id,
            **self.meter.summary(),
            "best_step": best.step if best.value is not None else None,  # None: no validation value was finite
            f"best_{best.metric}": best.value,
        }


def build(
    params: Params,
    plan: RunPlan,
    env: dist.DistEnv,
    device: torch.device,
    manifest: dict[str, Any],
    data_dir: str | Path,
    out: Path,
    ckpt: Checkpointer,
    tracker: Tracker,
    stop: StopFlag | None = None,
    source: Path | None = None,
) -> Trainer:
    """The trainer of this rank, resumed from the newest checkpoint in `ckpt`, else from
    `source` (train.resume_from), else seeded anew."""
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
    lr_schedule = functools.partial(
        schedule.build,
        total_steps=plan.total_steps,
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
    best_weights = outputs.BestWeights(params, manifest, ckpt)
    desc = run_name(params, env.world_size) if env.is_main else None  # the name reads git: rank 0 only
    trainer = Trainer(
        loop=loop,
        loader=loader,
        meter=Meter(train.untimed_steps, plan.global_batch),
        best=Best(train.best_metric, train.best_mode, train.early_stop_patience),
        tracker=tracker,
        env=env,
        device=device,
        total_steps=plan.total_steps,
        steps_per_epoch=plan.steps_per_epoch,
        grad_accum_steps=plan.grad_accum_steps,
        log_every_steps=train.log_every_steps,
        callbacks=callbacks.for_job(params, plan, out, ckpt, best_weights, val_split, stop, desc),
    )
    register_parts(trainer, train.seed)
    if state is None:
        seeds.seed_all(seeds.rank_seed(train.seed, env.rank))
    elif resumed_from is None:
        trainer.parts.load(state)  # the pending metrics too: those the killed try may not have stored
    else:  # on purpose, from a checkpoint of other params, data or code (its metrics stay in its run)
        restore_resumed(resumed_from, source, ckpt, trainer.parts, trainer.best, tracker)
    if state:  # the run says it went on from a checkpoint (the newest resume, if several)
        tracker.set_tags({"scalelab.resumed_from_step": trainer.step})
    trainer.meter.untimed_steps += trainer.step  # a resumed job's first steps are untimed too
    mark("model_built")  # model, optimizer, strategy wrapper and the checkpoint (if any) restored
    return trainer


def register_parts(t: Trainer, seed: int) -> None:
    """Every stateful part of the trainer, each under its name in the checkpoint. The RNG comes
    last: its fallback at another world size reads the step restored before it."""

    def set_step(step: int) -> None:
        t.step = step

    t.parts.register("weights", Weights(t.loop))  # model and optimizer, through the strategy
    for name, part in t.loop.stateful().items():  # scaler, LR schedule: found, not listed
        t.parts.register(name, StateDict(part))
    t.parts.register("counters", Counters(lambda: t.step, set_step, t.steps_per_epoch))
    t.parts.register(WINDOW_KEY, MeterWindow(t.meter, t.env, t.device))
    t.parts.register(PENDING_KEY, PendingMetrics(t.tracker))
    t.parts.register("best", StateDict(t.best))
    t.parts.register("rng", Rng(seed, t.env, lambda: t.step))


def build_workload(
    params: Params, manifest: dict[str, Any], env: dist.DistEnv, resuming_shards: bool
) -> tuple[workloads.Workload, dict[str, torch.Tensor] | None]:
    """The workload, its model initialised from `train.seed` identically on every rank.

    The strategy builds it (`strategy.Strategy.build`): whole on every rank, or under fsdp on the meta
    device with the initial weights made once on rank 0 and each rank receiving only its shards in
    `wrap`. Returns the workload and that initial state ({} on the other ranks; None when there is
    none).
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
    return strategy.get(train.strategy).build(build, env.is_main, resuming_shards)
