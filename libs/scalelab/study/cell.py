"""What runs inside one speedup-study cell: time training steps, or time all-reduces.

Started by scalelab.study.run: as a warm cell (`cell-worker warm`, `serve`: one timed repeat per
command of the coordinator, launch.warm), or in one go (`cell-worker steps`, `time_steps`: through
launch.local.run_ranks, or on SLURM as a `CellJob`). By hand:

    torchrun --standalone --nproc-per-node 2 -m scalelab.cli cell-worker steps \
        --spec results/speedup/cells/ddp-w2.spec.json --out /tmp/ddp-w2.json

Both kinds time with runtime.repeats (barrier, device sync, the slowest rank per repeat).

Each cell uses the same step function as training (training.loop.Loop.step) on synthetic batches
that already sit on the device, so it measures compute and communication, not data loading. It
also measures memory per rank: the peak (CUDA max allocated on the busiest of the GPUs the rank
drives, or the worker's peak RSS growth on a CPU) above what was held before the model was built,
with the peak reset once the model is wrapped (so FSDP's transient unsharded copy is not in it),
and the bytes of parameters, gradients and optimizer state this rank holds.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from scalelab.config import SpeedupConfig, build, strategies
from scalelab.launch import warm
from scalelab.runtime import dist, disturbance, memory, seeds
from scalelab.runtime.device import setup_process
from scalelab.runtime.repeats import repeat_totals, slowest_rank, timed_repeats
from scalelab.study import busy
from scalelab.training import strategy, workloads
from scalelab.training.loop import Optim, build_loop


def _setup(spec: dict[str, Any]) -> tuple[SpeedupConfig, dist.DistEnv, torch.device]:
    env = dist.read_env()
    device = setup_process(env, device=spec["device"], threads=spec["threads_per_process"])
    return build(SpeedupConfig, spec["config"], "speedup"), env, device


def rank_batch(cfg: SpeedupConfig, strategy_name: str, world_size: int, batch_size: int) -> int:
    """Samples each process feeds per step. dp is one process that splits its batch over GPUs:
    weak scaling gives each model replica `batch_size`, strong splits `batch_size` over processes."""
    strategy = strategies.get(strategy_name)
    processes = strategy.processes(world_size)
    if cfg.scaling == "weak":
        return batch_size * strategy.data_parallel_degree(world_size) // processes
    return batch_size // processes


def measured_build(devices: list[torch.device], build: Callable[[], Any]) -> tuple[Any, list[int]]:
    """`build()` (the model, wrapped), with the memory baseline of each of `devices` (bytes) taken
    before it and their peaks reset after it: the peak is training's, not the wrap's (FSDP moves
    each unit whole to the device before it shards it)."""
    cuda = devices[0].type == "cuda"
    baseline = [torch.cuda.memory_allocated(d) for d in devices] if cuda else [1024 * memory.status_kib("VmRSS")]
    built = build()
    for d in devices if cuda else []:
        torch.cuda.reset_peak_memory_stats(d)
    if not cuda:
        memory.reset_peak()
    return built, baseline


def peak_memory(devices: list[torch.device], baseline: list[int]) -> list[int]:
    """Each device's peak since `measured_build` above its baseline (bytes): every GPU a dp
    process drives; on a CPU, the process's resident peak."""
    if devices[0].type == "cuda":
        return [torch.cuda.max_memory_allocated(d) - base for d, base in zip(devices, baseline)]
    return [memory.peak_since(baseline[0])]


class Steps:
    """One cell's ranks, built: warm-up, then timed repeats one at a time (in rounds, when the
    study interleaves its cells), then the figures that do not change from repeat to repeat."""

    def __init__(self, spec, cfg, env, devices, wl, loop, pool, batch, memory_base) -> None:
        self.spec, self.cfg, self.env, self.devices, self.wl = spec, cfg, env, devices, wl
        self.device = devices[0]  # where the batches live (dp scatters them from here)
        self.loop, self.pool, self.batch, self.memory_base = loop, pool, batch, memory_base
        self.first_step_s, self.pids = float("nan"), [os.getpid()]

    @classmethod
    def build(cls, spec: dict[str, Any]) -> Steps:
        """Joins the process group, builds the workload and its step, and two synthetic batches."""
        cfg, env, device = _setup(spec)
        name, world = spec["strategy"], spec["world_size"]
        devices = strategy.get(name).devices(device, world)
        seeds.seed_all(cfg.seed)

        def build() -> tuple[workloads.Workload, Any]:
            shape = {"input_shape": [cfg.num_features], "num_classes": cfg.num_classes, "key": "speedup"}
            wl = workloads.load(cfg.workload, cfg.model, **shape)
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
            return wl, loop

        (wl, loop), memory_base = measured_build(devices, build)
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
        return cls(spec, cfg, env, devices, wl, loop, pool, batch, memory_base)

    def warmup(self) -> None:
        """The first step (timed: it compiles) and the rest of the warm-up steps, untimed."""
        first = timed_repeats(
            {"first": lambda i: self.loop.step([self.pool[0]])}, repeats=1, steps=1, device=self.device
        )
        self.first_step_s = slowest_rank(repeat_totals(first["first"]))[0]
        for i in range(1, self.cfg.warmup_steps):
            self.loop.step([self.pool[i % 2]])
        self.pids = dist.all_gather_object(os.getpid())  # ours: what the others took is the rest (rank 0's node)

    def repeat(self) -> dict[str, float]:
        """One timed repeat: its time (the slowest rank's) and what other processes took during
        it (rank 0's machine), the same on every rank."""
        before = disturbance.snapshot(self.pids) if self.env.is_main else None
        timed = timed_repeats(
            {"steps": lambda i: self.loop.step([self.pool[i % 2]])},
            repeats=1,
            steps=self.cfg.timed_steps,
            device=self.device,
        )
        took = None
        if self.env.is_main:
            took = disturbance.share(before, disturbance.snapshot(self.pids), os.cpu_count() or 1).as_dict()
        [slowest] = slowest_rank(repeat_totals(timed["steps"]))  # the slowest rank sets the pace
        return {"repeat_s": slowest, **dist.broadcast_object(took)}

    def figures(self) -> dict[str, Any]:
        """What does not change per repeat: sizes, batch, first step, memory (a collective)."""
        num_params = sum(p.numel() for p in self.wl.model.parameters())  # whole tensors (a DTensor counts all)
        return {
            "timed_steps": self.cfg.timed_steps,
            "global_batch": self.batch * strategies.get(self.spec["strategy"]).processes(self.spec["world_size"]),
            "num_params": num_params,
            "grad_bytes": 4 * num_params,
            "first_step_s": self.first_step_s,
            "compile": bool(self.spec["compile"]),
            **_memory(self.loop, self.devices, self.memory_base),
            "is_main": self.env.is_main,
        }


def summarize(figures: dict[str, Any], tally: busy.Tally) -> dict[str, Any]:
    """A cell's result from its fixed figures and its kept (and dropped) repeats. With no repeat
    kept, the cell is `invalid`: the machine was busy through every repeat it took."""
    compiled = bool(figures.get("compile"))
    figures = {k: v for k, v in figures.items() if k not in ("compile", "is_main")}
    kept, steps = [r["repeat_s"] for r in tally.kept], figures["timed_steps"]
    dropped = {"dropped": tally.dropped, "disturbance": [busy.share_of(r) for r in tally.kept]}
    if not kept:
        return {"status": "invalid", "reason": busy.all_dropped(tally), **figures, **dropped}
    step_s = statistics.median(kept) / steps
    first = figures["first_step_s"]
    return {
        "status": "ok",
        **figures,
        "repeat_s": kept,
        "step_time_ms": [1000.0 * s / steps for s in kept],
        "samples_per_s": [figures["global_batch"] * steps / s for s in kept],
        "compile_s": first - step_s if compiled else None,
        **dropped,  # disturbance, per kept repeat: others_cpu_share, steal_share, load_1m (rank 0's machine)
    }


def time_steps(spec: dict[str, Any]) -> dict[str, Any]:
    """Warm-up, then timed repeats of this one cell until `repeats` were kept (busy ones retried
    or dropped as study.busy says); the cell's result (on every rank; `is_main` on rank 0)."""
    steps = Steps.build(spec)
    steps.warmup()
    tally = busy.take_rounds(["cell"], lambda _: steps.repeat(), busy.Policy.of(steps.cfg))["cell"]
    figures = steps.figures()
    return {**summarize(figures, tally), "is_main": figures["is_main"]}


def serve(spec: dict[str, Any]) -> dict[str, Any]:
    """A warm cell (launch.warm): builds, then answers the coordinator's commands -- "warmup",
    "repeat" (one timed repeat), "done" -- and returns its fixed figures (rank 0's `is_main`).
    The cell's model is gone before the rank leaves its process group (see `measure`)."""
    figures = _answer_commands(spec)
    dist.shutdown()
    return {**figures, "ended_ms": int(time.time() * 1000)}


def _answer_commands(spec: dict[str, Any]) -> dict[str, Any]:
    steps = Steps.build(spec)
    channel = warm.Channel.connect(spec["channel"], steps.env.rank)
    started_ms = int(time.time() * 1000)
    try:
        for cmd in channel:
            if cmd["do"] == "warmup":
                started_ms = int(time.time() * 1000)
                steps.warmup()
                channel.answer({})
            elif cmd["do"] == "repeat":
                channel.answer(steps.repeat())
            elif cmd["do"] == "done":
                figures = steps.figures()
                channel.answer({})
                return {**figures, "started_ms": started_ms}
        raise RuntimeError("the coordinator went away before it said done")
    finally:
        channel.close()


def _memory(loop, devices: list[torch.device], baseline: list[int]) -> dict[str, Any]:
    """Peak memory (of the busiest device) and the state bytes this rank holds, each the largest
    over the ranks; `peak_mem_bytes_by_device`: every device's peak, rank by rank."""
    params = list(loop.model.parameters())
    optim_state = [t for state in loop.optimizer.state.values() for t in state.values() if torch.is_tensor(t)]
    peaks = peak_memory(devices, baseline)
    mine = {
        "peak_mem_bytes_per_rank": max(peaks),
        "param_bytes_per_rank": strategy.local_bytes(params),
        "grad_bytes_per_rank": strategy.local_bytes(p.grad for p in params),
        "optim_bytes_per_rank": strategy.local_bytes(optim_state),
    }
    every = dist.all_gather_object((mine, peaks))
    return {
        **{key: max(rank[key] for rank, _ in every) for key in mine},
        "peak_mem_bytes_by_device": [by_device for _, by_device in every],
        "mem_kind": "cuda_max_allocated" if devices[0].type == "cuda" else "rss_growth",
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
        from scalelab.launch import slurm

        slurm.export_rank_env()
        result = measure(self.kind, self.spec)
        result.pop("is_main")
        return result
