"""The loader: what fraction of a training step waits for data, with num_workers 0 and 2 (ranks:
`bench-worker loader`, under torchrun for a distributed strategy)."""

from __future__ import annotations

import itertools
import time
from typing import Any

from scalelab.bench import harness, pipeline, stats
from scalelab.bench.harness import Goal, opt
from scalelab.runtime import dist

METHOD = """\
The pipeline's default training job (params.yaml `train`, changed only by `--set`) on its prepared data
(made in a temporary folder from the same params, memory-mapped), with training's own loader (RunLoader,
workers persistent, each arm's started in an untimed warm-up epoch) and step (Loop.step). Per step, `wait`
is the time from asking for its micro-batches to having them (`first_step_wait_ms_per_epoch`: each epoch's
first step alone), `compute` that of Loop.step. The arms (num_workers) interleaved: a repeat runs the
epochs of each, the order alternating; busy repeats retried or dropped. A repeat's figure:
wait / (wait + compute) over its steps, on the rank that waited most; per arm the median over repeats."""
GOAL = Goal("<=", 0.05, "<= 5%")


def epoch_times(loop: Any, loader: Any, epoch: int, steps: int, accum: int = 1) -> list[float]:
    """[wait_s, compute_s, first_wait_s] of `steps` steps of one pass of `loader`."""
    marks = [time.perf_counter()]  # the start, then each step's got (its micro-batches) and done
    batches = loader.epoch(epoch)
    for _ in range(steps):
        micro = [next(batches) for _ in range(accum)]
        marks.append(time.perf_counter())
        loop.step(micro)
        marks.append(time.perf_counter())
    waits = [got - start for start, got in zip(marks[::2], marks[1::2])]
    computes = [done - got for got, done in zip(marks[1::2], marks[2::2])]
    return [sum(waits), sum(computes), waits[0] if waits else 0.0]


def time_arms(loop: Any, loaders: dict, steps: int, epochs: int, busy: dict, accum: int, warmup: int) -> tuple:
    """Interleaved repeats of every loader arm (`epochs` passes each, after an untimed warm-up
    pass): (arm -> repeat -> [wait_s, compute_s, first_wait_s] summed, the Repeats)."""
    for loader in loaders.values():  # first touch of model and optimizer state, and each loader's workers
        epoch_times(loop, loader, 0, warmup, accum)
    epoch, arms = itertools.count(1), list(loaders)  # every pass its own sampler order

    def take(i: int) -> dict[str, list[float]]:
        got = {}
        for arm in harness.rotated(arms, i):
            dist.barrier()
            passes = [epoch_times(loop, loaders[arm], next(epoch), steps, accum) for _ in range(epochs)]
            got[arm] = [sum(col) for col in zip(*passes)]
        return got

    reps = harness.take_repeats(take, busy)
    for loader in loaders.values():
        loader.close()
    return {arm: [r[arm] for r in reps.kept] for arm in arms}, reps


def measure_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """This rank's repeats on the job's own Loop (harness.rank_loop): every rank's wait and compute
    seconds per arm and repeat, and the job's shape."""
    from scalelab.data.store import open_split, verify
    from scalelab.training.loader import RunLoader
    from scalelab.training.plan import RunPlan

    train, manifest = pipeline.parsed(spec["params"]).train, verify(spec["data"])
    optim = {"name": train.optimizer, "lr": train.lr, "momentum": train.momentum, "weight_decay": train.weight_decay}
    same = ("workload", "model", "strategy", "precision", "seed", "device", "deterministic")  # train's names
    rank = harness.rank_loop({k: getattr(train, k) for k in same} | {
        "input_shape": manifest["input_shape"], "num_classes": manifest["num_classes"], "optim": optim, "batch": 1,
        "threads": train.threads_per_process, "timeout_s": min(train.collective_timeout_s, 120.0),  # a lost peer fails
    })  # fmt: skip
    split = open_split(spec["data"], "train", manifest, seq_len=rank.wl.seq_len)
    plan = RunPlan.of(train, len(split))
    loaders = {str(w): RunLoader(split, plan, rank.env, seed=train.seed, num_workers=int(w)) for w in spec["workers"]}
    steps, accum = plan.steps_per_epoch, plan.grad_accum_steps
    times, reps = time_arms(rank.loop, loaders, steps, spec["epochs"], spec["busy"], accum, warmup=steps)
    job = {"steps_per_epoch": steps, "per_rank_batch": plan.per_rank_batch, "world_size": plan.world_size}
    result = {"ranks": dist.all_gather_object(times), **job, **reps.json(), "is_main": rank.env.is_main}
    del rank, loaders  # the model (and its DDP reducer) goes before the process group
    dist.shutdown()
    return result


def arm_figures(per_rank: list[list[list[float]]], steps: int, epochs: int = 1) -> dict[str, Any]:
    """One arm's figures from rank -> repeat -> [wait_s, compute_s, (first_wait_s)]."""
    fractions = [max(wait / (wait + compute) for wait, compute, *_ in reps) for reps in zip(*per_rank)]
    return {
        "wait_fraction": stats.median(fractions),
        "repeat_wait_fractions": fractions,
        "wait_ms_per_step": [[1000.0 * rep[0] / steps for rep in r] for r in per_rank],
        "compute_ms_per_step": [[1000.0 * rep[1] / steps for rep in r] for r in per_rank],
        "first_step_wait_ms_per_epoch": [[1000.0 * rep[2] / epochs for rep in r] for r in per_rank],
    }


def measure(ctx: harness.Context) -> dict[str, Any]:
    """Prepares the data, then times every arm in the job's ranks; a figure per arm."""
    args = ctx.args
    raw = pipeline.params_tree(args.params, args.sets)
    train = pipeline.parsed(raw).train
    data = pipeline.prepare_data(raw, ctx.work / "prepared")
    spec = {"params": raw, "data": str(data), "workers": args.workers, "epochs": args.epochs, "busy": ctx.policy()}
    nproc = harness.ranks_of(train.strategy, train.nproc_per_node)
    job = ctx.ranks("loader", spec, "loader", nproc=nproc, threads=train.threads_per_process)
    steps = args.epochs * job["steps_per_epoch"]
    arms = {arm: arm_figures([rank[arm] for rank in job["ranks"]], steps, args.epochs) for arm in job["ranks"][0]}
    for arm, a in arms.items():
        wait = stats.median([stats.median(r) for r in a["wait_ms_per_step"]])
        text = f"step time waiting for data {100 * a['wait_fraction']:.1f}% at num_workers {arm} ({wait:.2f} ms/step)"
        ctx.figure(f"loader_workers{arm}", text, a["wait_fraction"], GOAL, dropped=job["dropped"])
    return {
        "params": str(args.params), "overrides": list(args.sets),
        "job": {"strategy": train.strategy, **{k: job[k] for k in ("world_size", "per_rank_batch", "steps_per_epoch")}},
        "repeats": args.repeats, "epochs_per_repeat": args.epochs, "num_workers": arms,
        **{k: job[k] for k in ("dropped", "disturbance")},
    }  # fmt: skip


OPTIONS = (
    opt("--params", "params.yaml", "the params to train with"),
    opt("--repeats", 5, "timed repeats of every arm"),
    opt("--epochs", 4, "epochs per arm and repeat"),
    opt("--workers", [0, 2], "num_workers of each arm"),
    pipeline.SET_OPTION,
)
BENCH = harness.Benchmark("loader", "loader.json", METHOD, measure, OPTIONS)
