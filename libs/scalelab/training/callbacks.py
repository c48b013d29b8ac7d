"""The cadences of a training job: small objects that `Trainer.fit` calls after each step.

A callback acts (`on_step`) when it is `due`: by default at every multiple of its
`every_n_steps` and at the last step. `begin` and `end` bracket the loop (a profiler or a progress
bar opens and closes there). `for_job` lists them in the order a step runs them: profile, log,
progress bar, validate, best and early stop, prune, stop flag, checkpoint. A later one sees what
an earlier one did: the checkpoint follows any stop (`Trainer.stop`) decided at the same step.
Every rank runs the same callbacks at the same steps (several are collectives).

A new cadence is one class here and one line in `for_job`.
"""

from __future__ import annotations

import logging
import math
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from scalelab.config import Params
from scalelab.data.store import Split
from scalelab.runtime.signals import StopFlag
from scalelab.training import profiling, sampling, workloads
from scalelab.training.checkpoint import Checkpointer
from scalelab.training.evaluation import evaluate, named
from scalelab.training.outputs import BestWeights
from scalelab.training.plan import RunPlan
from scalelab.training.pruning import Pruning

if TYPE_CHECKING:
    from scalelab.training.trainer import Trainer

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The training loss is NaN or infinite: the job stops, FAILED, and keeps its good checkpoints."""

    def __init__(self, value: float, step: int, ckpt: Checkpointer) -> None:
        last = ckpt.steps()[:1]
        super().__init__(
            f"train_loss = {value} at step {step} is not finite: training diverged; the newest "
            f"checkpoint stays step {last[0] if last else 'none'}; lower train.lr or use precision fp32"
        )


class Callback:
    """A cadence: `on_step` after each step it is `due` (every `every_n_steps` and the last one);
    `begin` opens what it needs for the loop (on `stack`, closed however the loop ends), `end`
    runs after the loop."""

    every_n_steps = 1

    def due(self, t: Trainer) -> bool:
        return t.step % self.every_n_steps == 0 or t.step == t.total_steps

    def begin(self, t: Trainer, stack: ExitStack) -> None: ...
    def on_step(self, t: Trainer) -> None: ...
    def end(self, t: Trainer) -> None: ...


class Periodic(Callback):
    """Due at the multiples of `every_n_steps` only, not at a last step in between."""

    def due(self, t: Trainer) -> bool:
        return t.step % self.every_n_steps == 0


class Profile(Callback):
    """torch.profiler around the first steps (train.profile), stepped once per step."""

    def __init__(self, params: Params, out: Path) -> None:
        self.cfg, self.folder = params.train.profile, out / "profile"

    def begin(self, t: Trainer, stack: ExitStack) -> None:
        self.prof = stack.enter_context(profiling.profiler(self.cfg, self.folder, t.env.rank))

    def on_step(self, t: Trainer) -> None:
        self.prof.step()


class LogMetrics(Callback):
    """Closes the meter's window every `train.log_every_steps`: loss, throughput, lr and gradient
    norm (before clipping) go to the tracker; a loss that is not finite stops the job."""

    def __init__(self, every_n_steps: int, ckpt: Checkpointer) -> None:
        self.every_n_steps, self.ckpt = every_n_steps, ckpt

    def on_step(self, t: Trainer) -> None:
        window = {**t.meter.window(t.step, t.device), "lr": t.loop.last["lr"]}
        window["grad_norm"] = float(t.loop.last["grad_norm"])  # measured at logging steps (Trainer.fit)
        t.tracker.log_metrics(window, t.step)
        if not math.isfinite(window["train_loss"]):  # the same value on every rank
            raise NonFiniteLossError(window["train_loss"], t.step, self.ckpt)
        t.window = window


class ProgressBar(Callback):
    """A tqdm bar on global rank 0, with the last window's loss and throughput."""

    def __init__(self, desc: str | None, log_every_steps: int) -> None:
        self.desc, self.log_every_steps = desc, log_every_steps

    def begin(self, t: Trainer, stack: ExitStack) -> None:
        self.bar = tqdm(
            total=t.total_steps,
            initial=t.step,
            disable=not t.env.is_main,
            file=sys.stderr,
            mininterval=1.0 if sys.stderr.isatty() else 10.0,
            desc=self.desc,
        )

    def on_step(self, t: Trainer) -> None:
        self.bar.update(1)
        if t.step % self.log_every_steps == 0 or t.step == t.total_steps:  # a window was just logged
            loss, samples_s = t.window["train_loss"], t.window.get("samples_per_s", 0)
            self.bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{samples_s:,.0f}", refresh=False)

    def end(self, t: Trainer) -> None:
        self.bar.close()


class Validate(Periodic):
    """At the end of each epoch: the validation metrics (`val_*`) into `t.val` and the tracker;
    for a token workload, `train.sample_tokens` sampled tokens too."""

    def __init__(self, every_n_steps: int, split: Split, params: Params, seq_len: int) -> None:
        self.every_n_steps, self.split, self.seq_len = every_n_steps, split, seq_len
        self.sample_tokens, self.seed = params.train.sample_tokens, params.train.seed

    def on_step(self, t: Trainer) -> None:
        t.val = named(evaluate(t.loop.model, t.loop.workload, self.split, t.env, t.device), self.split.kind, "val")
        t.tracker.log_metrics(t.val, t.step)
        if self.split.kind == "tokens" and self.sample_tokens:  # every rank: fsdp's forward
            sampling.log_samples(
                t.loop.model, self.split, self.seq_len, self.sample_tokens, t.step, self.seed, t.device, t.tracker
            )


class BestAndEarlyStop(Periodic):
    """After each validation: the best value so far (its weights kept for best.pt) and, with
    `train.early_stop_patience`, a stop after that many validations without a better one."""

    def __init__(self, every_n_steps: int, best_weights: BestWeights) -> None:
        self.every_n_steps, self.best_weights = every_n_steps, best_weights

    def on_step(self, t: Trainer) -> None:
        if t.best.update(t.val, t.step):  # every rank: the same all-reduced values
            self.best_weights.keep(t.loop, t.env, t.best)
        if t.best.should_stop and t.step < t.total_steps:
            t.stop("early_stop")

    def end(self, t: Trainer) -> None:
        if t.stop_reason == "early_stop":
            best = t.best
            log.info(
                "early stop at step %d of %d: %s has not improved for %d validations (best %s)",
                t.step,
                t.total_steps,
                best.metric,
                best.since_better,
                f"{best.value:.6g} at step {best.step}" if best.value is not None else "none: no value was finite",
            )


class Prune(Periodic):
    """A search trial: after each validation but the last, its pruner may stop it (training.pruning)."""

    def __init__(self, every_n_steps: int, pruning: Pruning) -> None:
        self.every_n_steps, self.pruning = every_n_steps, pruning

    def on_step(self, t: Trainer) -> None:
        if t.step < t.total_steps and self.pruning.should_prune(t.val, t.step // self.every_n_steps, t.env):
            t.stop("pruned")


class StopCheck(Periodic):
    """Every `slurm.stop_check_every_steps`: has any rank been asked to stop (SIGTERM, a
    preemption)? Every rank checks at the same steps: the check is an all-reduce (and a host sync)."""

    def __init__(self, every_n_steps: int, flag: StopFlag) -> None:
        self.every_n_steps, self.flag = every_n_steps, flag

    def on_step(self, t: Trainer) -> None:
        if self.flag.everywhere(t.device):
            t.stop("preempted")


class Checkpoint(Callback):
    """Every `train.checkpoint_every_steps`, at the last step and at any stop: best.pt (rank 0),
    then every checkpoint part (training.checkpoint_parts). A window whose loss is not finite is
    never checkpointed."""

    def __init__(self, every_n_steps: int, ckpt: Checkpointer, best_weights: BestWeights) -> None:
        self.every_n_steps, self.ckpt, self.best_weights = every_n_steps, ckpt, best_weights

    def due(self, t: Trainer) -> bool:
        return super().due(t) or t.stop_reason is not None

    def on_step(self, t: Trainer) -> None:
        if t.meter.window_steps and not t.meter.window_is_finite(t.device):
            raise NonFiniteLossError(float("nan"), t.step, self.ckpt)
        if t.env.is_main:
            self.best_weights.write()  # best.pt agrees with the checkpoint written next
        state, shards = t.parts.state()
        if t.env.is_main or shards is not None:  # sharded: every rank writes its own
            self.ckpt.save(t.step, state, shards)

    def end(self, t: Trainer) -> None:
        self.ckpt.wait()  # the last (asynchronous) checkpoint is committed before the job ends


def for_job(
    params: Params,
    plan: RunPlan,
    out: Path,
    ckpt: Checkpointer,
    best_weights: BestWeights,
    val_split: Split,
    stop: StopFlag | None,
    desc: str | None,
) -> list[Callback]:
    """The train job's callbacks, in the order each step runs them."""
    t, per_epoch = params.train, plan.steps_per_epoch
    seq_len = workloads.seq_len(t.workload, t.model)
    pruning = Pruning.of(out)  # a search trial: its pruner may stop it at a validation
    found: list[Callback | None] = [
        Profile(params, out),
        LogMetrics(t.log_every_steps, ckpt),
        ProgressBar(desc, t.log_every_steps),
        Validate(per_epoch, val_split, params, seq_len),
        BestAndEarlyStop(per_epoch, best_weights),
        Prune(per_epoch, pruning) if pruning is not None else None,
        StopCheck(params.slurm.stop_check_every_steps, stop) if stop is not None else None,
        Checkpoint(t.checkpoint_every_steps, ckpt, best_weights),
    ]
    return [c for c in found if c is not None]
