"""The loader: what fraction of a training step waits for data, with num_workers 0 and 2.

    scalelab bench loader --out results/bench     # -> results/bench/loader.json

The ranks run through launch.local.run_ranks (under torchrun for ddp, as one process otherwise);
one by hand, with a spec.json that `run` wrote:

    torchrun --standalone --nproc-per-node 2 -m scalelab.cli bench-worker loader --spec SPEC.json --out OUT.json

The method is METHOD below; the JSON file carries it.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalelab.bench import pipeline, stats
from scalelab.config import strategies
from scalelab.launch.local import LaunchError, run_ranks
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.repeats import timed_repeats

METHOD = """\
The pipeline's default training job (params.yaml `train`, changed only by `--set`): its strategy
and processes (torchrun for ddp, gloo), threads, model, optimizer, batch and plan, on the
pipeline's prepared data (made in a temporary folder from the same params: byte for byte what
`dvc repro prepare` writes, memory-mapped), with training's own loader (training.loader.RunLoader:
one DataLoader for the run, its workers persistent across epochs, as `scalelab train` makes it;
each arm's loader is made and its workers started in an untimed warm-up epoch) and training's own
step (Loop.step). For each step, `wait` is the time from asking for the step's micro-batches to
having them (the first step of an epoch includes restarting the pass over the sampler:
`first_step_wait_ms_per_epoch` shows that part alone), and `compute` the time of Loop.step.
Arms: num_workers 0 and 2 (`--workers`), interleaved: every repeat runs `--epochs` epochs of
each, the order alternating. A repeat's figure is wait / (wait + compute) summed over its steps,
on the rank that waited most. Reported per arm: the median over repeats, and every
repeat's fraction. Tracking, checkpoints and evaluation are left out: they are not data loading.
"""
OUT_FILE = "loader.json"
TARGET_FRACTION = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml", help="the params to train with (default: params.yaml)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of every arm (default: 5)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per arm and repeat")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="num_workers of each arm")
    pipeline.add_set_argument(parser)


# ---- one rank (runs in the worker processes) ----


def _epoch(loop: Any, loader: Any, plan: Any, epoch: int) -> list[float]:
    """One epoch; returns [wait_s, compute_s, first_wait_s] (first_wait_s: the first step's wait)."""
    wait_s = compute_s = 0.0
    first_wait_s = None
    start = time.perf_counter()
    batches = loader.epoch(epoch)
    for _ in range(plan.steps_per_epoch):
        micro = [next(batches) for _ in range(plan.grad_accum_steps)]
        got = time.perf_counter()
        loop.step(micro)
        done = time.perf_counter()
        wait_s += got - start
        first_wait_s = got - start if first_wait_s is None else first_wait_s
        compute_s += done - got
        start = done
    return [wait_s, compute_s, first_wait_s or 0.0]


def _rank_times(spec: dict[str, Any], train: Any, env: Any, device: Any) -> tuple[dict[str, Any], Any]:
    """This rank's interleaved repeats; returns (times per arm, plan). The model and its DDP reducer
    are freed when this returns, before the process group goes (or exit can deadlock)."""
    from scalelab.data.store import open_split, verify
    from scalelab.runtime import seeds
    from scalelab.training import workloads
    from scalelab.training.loader import RunLoader
    from scalelab.training.loop import Optim, build_loop
    from scalelab.training.plan import RunPlan

    manifest = verify(spec["data"])
    split = open_split(spec["data"], "train", manifest, seq_len=workloads.seq_len(train.workload, train.model))
    plan = RunPlan.of(train, len(split))
    seeds.seed_all(train.seed)
    wl = workloads.load(
        train.workload, train.model, input_shape=manifest["input_shape"], num_classes=manifest["num_classes"]
    )
    optim = Optim(name=train.optimizer, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    loop = build_loop(wl, device, strategy_name=train.strategy, precision=train.precision, optim=optim)
    loaders = {str(w): RunLoader(split, plan, env, seed=train.seed, num_workers=int(w)) for w in spec["workers"]}
    for loader in loaders.values():  # warm-up: first-touch of model and optimizer state, and each loader's workers
        _epoch(loop, loader, plan, 0)
    epochs, epoch = spec["epochs"], itertools.count(1)  # every epoch its own sampler order
    figures: dict[str, list[list[float]]] = {w: [] for w in loaders}

    def arm(workers: str) -> Callable[[int], None]:
        return lambda i: figures[workers].append(_epoch(loop, loaders[workers], plan, next(epoch)))

    timed_repeats({w: arm(w) for w in figures}, repeats=spec["repeats"], steps=epochs)
    times = {  # summed over each repeat's epochs
        w: [[sum(col) for col in zip(*f[r * epochs : (r + 1) * epochs])] for r in range(spec["repeats"])]
        for w, f in figures.items()
    }
    for loader in loaders.values():
        loader.close()
    return times, plan


def measure_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """Interleaved repeats of every arm on this rank; returns [wait_s, compute_s, first_wait_s]
    summed over epochs, per arm and repeat, for every rank."""
    from scalelab.config import parse_params
    from scalelab.runtime import dist
    from scalelab.runtime.device import setup_process

    train = parse_params(spec["params"], "params").train
    env = dist.read_env()
    device = setup_process(
        env,
        device=train.device,
        threads=train.threads_per_process,
        deterministic=train.deterministic,
        timeout_s=min(train.collective_timeout_s, 120.0),  # a lost peer fails the benchmark, not hangs it
    )
    times, plan = _rank_times(spec, train, env, device)
    ranks = dist.all_gather_object(times)
    dist.shutdown()
    return {
        "ranks": ranks,
        "steps_per_epoch": plan.steps_per_epoch,
        "per_rank_batch": plan.per_rank_batch,
        "world_size": plan.world_size,
        "strategy": train.strategy,
        "is_main": env.is_main,
    }


# ---- the benchmark (runs in `scalelab bench loader`) ----


def measure_job(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Prepares the data, runs the job's ranks in fresh processes; returns (params, rank 0's result)."""
    raw = pipeline.params_tree(args.params, args.sets)
    train = pipeline.parsed(raw).train
    data = pipeline.prepare_data(raw, work / "prepared")
    spec = {"params": raw, "data": str(data), "workers": args.workers, "repeats": args.repeats, "epochs": args.epochs}
    nproc = train.nproc_per_node if strategies.get(train.strategy).distributed else None
    ranks = {"nproc": nproc, "threads_per_process": train.threads_per_process}
    try:
        return raw, run_ranks(["bench-worker", "loader"], spec, work, "loader", **ranks)
    except LaunchError as exc:
        raise LaunchError(f"loader benchmark ({train.strategy} ranks): {exc}") from exc


def summarize(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    arms = {}
    for arm in (str(w) for w in args.workers):
        per_rank = [rank[arm] for rank in raw["ranks"]]  # rank -> repeat -> [wait_s, compute_s, first_wait_s]
        fractions = [max(r[i][0] / (r[i][0] + r[i][1]) for r in per_rank) for i in range(args.repeats)]
        steps = args.epochs * raw["steps_per_epoch"]
        median = stats.median(fractions)
        arms[arm] = {
            "wait_fraction": median,
            "repeat_wait_fractions": fractions,
            "wait_ms_per_step": [[1000.0 * r[i][0] / steps for i in range(args.repeats)] for r in per_rank],
            "compute_ms_per_step": [[1000.0 * r[i][1] / steps for i in range(args.repeats)] for r in per_rank],
            "first_step_wait_ms_per_epoch": [
                [1000.0 * r[i][2] / args.epochs for i in range(args.repeats)] for r in per_rank
            ],
            "meets_target": median <= TARGET_FRACTION,
        }
    return {
        "benchmark": "loader",
        "method": METHOD.strip(),
        "params": str(args.params),
        "overrides": list(args.sets),
        "job": {k: raw[k] for k in ("strategy", "world_size", "per_rank_batch", "steps_per_epoch")},
        "repeats": args.repeats,
        "epochs_per_repeat": args.epochs,
        "num_workers": arms,
        "target_fraction": TARGET_FRACTION,
        "meets_target": all(a["meets_target"] for a in arms.values()),
        **stats.machine(),
    }


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Measures, writes loader.json and one summary line per num_workers; returns the result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bench-loader-", dir=out_dir))
    try:
        _, job = measure_job(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = summarize(job, args)
    atomic_write_json(out_dir / OUT_FILE, result)
    for arm, a in result["num_workers"].items():
        wait = stats.median([stats.median(r) for r in a["wait_ms_per_step"]])
        figure = f"step time waiting for data {100 * a['wait_fraction']:.1f}% at num_workers {arm} ({wait:.2f} ms/step)"
        stats.write_summary_line(
            out_dir, f"loader_workers{arm}", figure, f"<= {100 * TARGET_FRACTION:.0f}%", a["meets_target"]
        )
    return result


def headline(result: dict, out: Path) -> str:
    parts = [f"num_workers {arm}: {100 * a['wait_fraction']:.1f}%" for arm, a in result["num_workers"].items()]
    return f"loader: step time waiting for data, {'; '.join(parts)} -> {out / OUT_FILE}"
