"""The training engine: one loop for single, DataParallel and DDP runs.

Run it through the stage command (`scalelab train`), which validates params and starts torchrun
for ddp. By hand, on 2 CPU processes:

    torchrun --standalone --nproc-per-node 2 -m scalelab.cli train-worker \
        --params params.yaml --data data/prepared --out results/train
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from scalelab import data, dist, seeds, strategy, workloads
from scalelab.config import to_dict
from scalelab.params import TrainConfig, resolve_device

log = logging.getLogger(__name__)
# knobs that change neither the math nor the data order: a resume may differ in these
CADENCE_KEYS = ("log_every_steps", "checkpoint_every_steps", "keep_checkpoints", "profile", "launcher")


def fingerprint(train: TrainConfig, manifest: dict[str, Any], world_size: int) -> str:
    """A hash of everything that decides the final weights."""
    cfg = {k: v for k, v in to_dict(train).items() if k not in CADENCE_KEYS}
    blob = json.dumps({"train": cfg, "data": manifest["splits"], "world_size": world_size},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def setup_process(train: TrainConfig, env: dist.DistEnv) -> torch.device:
    """Threads, determinism and the device of this rank; joins the process group."""
    torch.set_num_threads(train.threads_per_process)
    torch.use_deterministic_algorithms(train.deterministic, warn_only=True)
    kind = resolve_device(train)
    device = torch.device(kind, env.local_rank) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(device)
    dist.init(env, kind)
    return device


@dataclass(kw_only=True)
class Loop:
    """Everything the step function touches (assigned once; no work in construction)."""

    model: torch.nn.Module
    workload: workloads.Workload
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    precision: str
    device: torch.device

    def autocast(self):
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
        if self.precision == "fp32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=dtypes[self.precision])

    def step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step over `grad_accum_steps` micro-batches; returns the summed loss.

        Gradients are all-reduced on the last micro-batch only (no_sync on the others).
        """
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(micro_batches):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with strategy.no_sync(self.model, sync=i == len(micro_batches) - 1):
                with self.autocast():
                    loss = self.workload.loss(self.model(x), y) / len(micro_batches)
                self.scaler.scale(loss).backward()
            total += loss.detach()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return total


def build_loop(train: TrainConfig, wl: workloads.Workload, device: torch.device) -> Loop:
    """Wraps the workload's model for the strategy and builds optimizer and scaler."""
    model = strategy.wrap(wl.model, train.strategy, device)
    if train.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=train.lr, momentum=train.momentum,
                              weight_decay=train.weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=train.precision == "fp16")
    return Loop(model=model, workload=wl, optimizer=opt, scaler=scaler, precision=train.precision,
                device=device)


def make_loader(x: torch.Tensor, y: torch.Tensor, train: TrainConfig, env: dist.DistEnv,
                epoch: int, skip_batches: int) -> tuple[DataLoader, int]:
    """This rank's batches for `epoch`, starting after `skip_batches` (the resume position).

    Returns the loader and the number of optimizer steps in a full epoch.
    """
    sampler = DistributedSampler(data.TensorPairs(x, y), num_replicas=env.world_size,
                                 rank=env.rank, shuffle=True, seed=train.seed, drop_last=True)
    sampler.set_epoch(epoch)
    order = list(sampler)
    per_step = train.batch_size * train.grad_accum_steps
    steps = len(order) // per_step
    batches = [order[i:i + train.batch_size] for i in range(0, steps * per_step, train.batch_size)]
    loader = DataLoader(data.TensorPairs(x, y), batch_sampler=batches[skip_batches:],
                        collate_fn=_identity, num_workers=train.num_workers,
                        worker_init_fn=_WorkerSeed(train.seed, env.rank),
                        # its own generator: making an iterator must not draw from the global RNG,
                        # or a resumed epoch would shift every later dropout mask
                        generator=torch.Generator().manual_seed(seeds.rank_seed(train.seed, env.rank)))
    return loader, steps


def _identity(batch: Any) -> Any:
    return batch


class _WorkerSeed:
    """worker_init_fn: seeds worker w of rank r with seeds.worker_seed(base, r, w)."""

    def __init__(self, base: int, rank: int) -> None:
        self.base, self.rank = base, rank

    def __call__(self, worker: int) -> None:
        seeds.seed_all(seeds.worker_seed(self.base, self.rank, worker))


@torch.no_grad()
def evaluate(loop_model: torch.nn.Module, wl: workloads.Workload, x: torch.Tensor, y: torch.Tensor,
             env: dist.DistEnv, device: torch.device, batch_size: int = 1024) -> dict[str, float]:
    """Loss and accuracy over (x, y), sharded across ranks and summed exactly (no padding)."""
    was_training = loop_model.training
    loop_model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    xs, ys = x[env.rank::env.world_size], y[env.rank::env.world_size]
    for i in range(0, len(ys), batch_size):
        xb, yb = xs[i:i + batch_size].to(device), ys[i:i + batch_size].to(device)
        m = wl.metrics(loop_model(xb), yb)
        sums += torch.stack([m["loss_sum"].double(), m["correct"].double(),
                             torch.tensor(len(yb), dtype=torch.float64, device=device)])
    loop_model.train(was_training)
    if env.world_size > 1:
        dist.all_reduce_sum(sums)
    loss_sum, correct, count = sums.tolist()
    return {"loss": loss_sum / max(count, 1), "accuracy": correct / max(count, 1)}


class Meter:
    """Aggregates loss and timing over a logging window; warm-up steps are left out of timing."""

    def __init__(self, warmup_steps: int, samples_per_step: int) -> None:
        self.warmup_steps, self.samples_per_step = warmup_steps, samples_per_step
        self.loss_sum: torch.Tensor | None = None
        self.window_steps = 0
        self.timed_steps, self.timed_s = 0, 0.0
        self.mark = time.perf_counter()

    def add(self, step: int, loss: torch.Tensor) -> None:
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.window_steps += 1
        if step == self.warmup_steps:  # warm-up ends here: timing starts from now
            self.mark = time.perf_counter()

    def window(self, step: int, device: torch.device) -> dict[str, float]:
        """Closes the window: loss averaged over steps and ranks, throughput after warm-up."""
        if device.type == "cuda":
            torch.cuda.synchronize()  # note: a CPU-GPU sync point, once per window
        now = time.perf_counter()
        sums = torch.stack([self.loss_sum.float(), torch.tensor(float(self.window_steps), device=device)])
        loss_sum, steps = dist.all_reduce_sum(sums).tolist()
        out = {"train_loss": loss_sum / steps}
        timed = min(self.window_steps, step - self.warmup_steps)
        if timed > 0:
            elapsed_s = now - self.mark
            self.timed_steps += timed
            self.timed_s += elapsed_s
            out["step_time_ms"] = 1000.0 * elapsed_s / timed
            out["samples_per_s"] = self.samples_per_step * timed / elapsed_s
        self.loss_sum, self.window_steps, self.mark = None, 0, now
        return out

    def summary(self) -> dict[str, float]:
        if not self.timed_steps:
            return {}
        return {"samples_per_s": self.samples_per_step * self.timed_steps / self.timed_s,
                "step_time_ms": 1000.0 * self.timed_s / self.timed_steps}


def restore(state: dict[str, Any] | None, loop: Loop, train: TrainConfig, env: dist.DistEnv) -> int:
    """Restores a checkpoint if given, else seeds this rank; returns the global step.

    The epoch and the sampler position follow from the step: step // steps_per_epoch, and the
    remainder in optimizer steps.
    """
    if state is None:
        seeds.seed_all(seeds.rank_seed(train.seed, env.rank))
        return 0
    strategy.unwrap(loop.model).load_state_dict(state["model"])
    loop.optimizer.load_state_dict(state["optimizer"])
    loop.scaler.load_state_dict(state["scaler"])
    seeds.set_rng_state(state["rng"][env.rank])
    return state["step"]


def checkpoint_state(loop: Loop, epoch: int, run_id: str | None) -> dict[str, Any]:
    """Gathers every rank's RNG state; the returned dict is complete on rank 0 only."""
    rngs = dist.all_gather_object(seeds.rng_state())
    return {"model": strategy.unwrap(loop.model).state_dict(), "optimizer": loop.optimizer.state_dict(),
            "scaler": loop.scaler.state_dict(), "epoch": epoch, "rng": rngs, "run_id": run_id}
