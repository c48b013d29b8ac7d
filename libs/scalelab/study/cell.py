"""What runs inside one speedup-study cell: time training steps, or time all-reduces.

Started by scalelab.study.run through launch.local.run_ranks (one process, or torchrun for ddp),
or on SLURM as a `CellJob`. By hand:

    torchrun --standalone --nproc-per-node 2 -m scalelab.cli cell-worker steps \
        --spec results/speedup/cells/ddp-w2.spec.json --out /tmp/ddp-w2.json

Both kinds time with runtime.repeats (barrier, device sync, the slowest rank per repeat).

Each cell uses the same step function as training (training.loop.Loop.step) on synthetic batches
that already sit on the device, so it measures compute and communication, not data loading. It
also measures memory per rank: the peak (CUDA max allocated, or the worker's peak RSS growth on a
CPU) and the bytes of parameters, gradients and optimizer state this rank holds.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import torch

from scalelab.config import SpeedupConfig, build, strategies
from scalelab.runtime import dist, disturbance, memory, seeds
from scalelab.runtime.device import setup_process
from scalelab.runtime.repeats import repeat_totals, slowest_rank, timed_repeats
from scalelab.training import strategy, workloads
from scalelab.training.loop import Optim, build_loop


def _setup(spec: dict[str, Any]) -> tuple[SpeedupConfig, dist.DistEnv, torch.device]:
    env = dist.read_env()
    device = setup_process(env, device=spec["device"], threads=spec["threads_per_process"])
    return build(SpeedupConfig, spec["config"], "speedup"), env, device


def rank_batch(cfg: SpeedupConfig, strategy_name: str, world_size: int, batch_size: int) -> int:
    """Samples each process feeds per step. dp is one process that splits its batch over GPUs."""
    processes = strategies.get(strategy_name).processes(world_size)
    if cfg.scaling == "weak":
        return batch_size * world_size // processes
    return batch_size // processes


def _start_memory(device: torch.device) -> int:
    """Resets the peak and returns the baseline it is measured from (bytes)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    return memory.reset_peak()


def _peak_memory(device: torch.device, baseline: int) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) - baseline
    return memory.peak_since(baseline)


def time_steps(spec: dict[str, Any]) -> dict[str, Any]:
    """Warm-up, then `repeats` x `timed_steps` timed steps; returns per-repeat figures (rank 0)."""
    cfg, env, device = _setup(spec)
    name, world = spec["strategy"], spec["world_size"]
    memory_base = _start_memory(device)
    seeds.seed_all(cfg.seed)
    wl = workloads.load(
        cfg.workload, cfg.model, input_shape=[cfg.num_features], num_classes=cfg.num_classes, key="speedup"
    )
    loop = build_loop(
        wl,
        device,
        strategy_name=name,
        precision=spec["precision"],
        optim=Optim(name="sgd", lr=1e-3),
        compile=spec["compile"],
        activation_checkpointing=spec.get("activation_checkpointing", False),
        num_devices=world,
    )
    seeds.seed_all(seeds.rank_seed(cfg.seed, env.rank))
    batch = rank_batch(cfg, name, world, spec["batch_size"])
    if wl.synthetic_batch:  # the workload's own data (gpt: token ids)
        pool = [wl.synthetic_batch(batch, device=device) for _ in range(2)]
    else:
        features, classes = cfg.num_features, cfg.num_classes
        pool = [
            (torch.randn(batch, features, device=device), torch.randint(classes, (batch,), device=device))
            for _ in range(2)
        ]
    first = timed_repeats({"first": lambda i: loop.step([pool[0]])}, repeats=1, steps=1, device=device)  # compiles
    first_step_s = slowest_rank(repeat_totals(first["first"]))[0]
    for i in range(1, cfg.warmup_steps):
        loop.step([pool[i % 2]])
    pids = dist.all_gather_object(os.getpid())  # ours: what the others took is the rest (rank 0's node)
    totals, shares = [], []
    for _ in range(cfg.repeats):  # one repeat at a time, with what other processes took during it
        before = disturbance.snapshot(pids) if env.is_main else None
        timed = timed_repeats(
            {"steps": lambda i: loop.step([pool[i % 2]])}, repeats=1, steps=cfg.timed_steps, device=device
        )
        totals += repeat_totals(timed["steps"])
        if env.is_main:
            shares.append(disturbance.share(before, disturbance.snapshot(pids), os.cpu_count() or 1).as_dict())
    slowest = slowest_rank(totals)  # the slowest rank sets the pace
    memory = _memory(loop, device, memory_base)
    num_params = sum(p.numel() for p in wl.model.parameters())  # whole tensors (a DTensor counts all)
    global_batch = batch * strategies.get(name).processes(world)
    step_s = statistics.median(slowest) / cfg.timed_steps
    return {
        "repeat_s": slowest,
        "timed_steps": cfg.timed_steps,
        "global_batch": global_batch,
        "step_time_ms": [1000.0 * s / cfg.timed_steps for s in slowest],
        "samples_per_s": [global_batch * cfg.timed_steps / s for s in slowest],
        "num_params": num_params,
        "grad_bytes": 4 * num_params,
        "first_step_s": first_step_s,
        "compile_s": first_step_s - step_s if spec["compile"] else None,
        **memory,
        "disturbance": shares,  # per repeat: others_cpu_share, steal_share, load_1m (rank 0's machine)
        "is_main": env.is_main,
    }


def _memory(loop, device: torch.device, baseline: int) -> dict[str, Any]:
    """Peak memory and the state bytes this rank holds, each the largest over the ranks."""
    params = list(loop.model.parameters())
    optim_state = [t for state in loop.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    mine = {
        "peak_mem_bytes_per_rank": _peak_memory(device, baseline),
        "param_bytes_per_rank": strategy.local_bytes(params),
        "grad_bytes_per_rank": strategy.local_bytes(p.grad for p in params),
        "optim_bytes_per_rank": strategy.local_bytes(optim_state),
    }
    every = dist.all_gather_object(mine)
    return {
        **{key: max(rank[key] for rank in every) for key in mine},
        "mem_kind": "cuda_max_allocated" if device.type == "cuda" else "rss_growth",
    }


def time_allreduce(spec: dict[str, Any]) -> dict[str, Any]:
    """Median all-reduce time for a few sizes up to the model's gradient size."""
    _, env, device = _setup(spec)
    results = []
    for fraction in (1 / 16, 1 / 4, 1.0):
        numel = max(1, int(spec["grad_bytes"] * fraction) // 4)
        tensor = torch.ones(numel, device=device)
        for _ in range(3):
            dist.all_reduce_sum(tensor)
        timed = timed_repeats(
            {"all_reduce": lambda i, t=tensor: dist.all_reduce_sum(t)},
            repeats=spec.get("reps", 10),
            steps=1,
            device=device,
        )
        worst = slowest_rank(repeat_totals(timed["all_reduce"]))
        results.append({"bytes": 4 * numel, "median_s": statistics.median(worst)})
    return {
        "world_size": env.world_size,
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "sizes": results,
        "is_main": env.is_main,
    }


def measure(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Runs the cell, then leaves the process group. Leaving only after the measurement's DDP
    model is gone matters: a Reducer freed after its process group can deadlock on the GIL.
    `started_ms` and `ended_ms` (epoch) bound the measurement: the cell's MLflow run spans them."""
    started_ms = int(time.time() * 1000)
    result = (time_allreduce if kind == "allreduce" else time_steps)(spec)
    dist.shutdown()
    return {**result, "started_ms": started_ms, "ended_ms": int(time.time() * 1000)}


class CellJob:
    """One cell (or the all-reduce benchmark) as a SLURM job: every task runs one rank."""

    def __init__(self, kind: str, spec: dict[str, Any]) -> None:
        self.kind, self.spec = kind, spec

    def __call__(self) -> dict[str, Any]:
        import submitit

        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        result = measure(self.kind, self.spec)
        result.pop("is_main")
        return result
