"""Engine parity: scalelab's training step against a hand-written PyTorch loop, same everything.

    scalelab bench parity --out results/bench     # -> results/bench/parity.json

The ranks of a strategy run through launch.local.run_ranks, once per strategy; by hand, with a
spec.json that `run` wrote:

    python -m scalelab.cli bench-worker parity --spec SPEC.json --out OUT.json      # single
    torchrun --standalone --nproc-per-node 2 -m scalelab.cli bench-worker parity --spec SPEC.json --out OUT.json

The method is METHOD below; the JSON file carries it.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path
from typing import Any

import torch

from scalelab.bench import plain_loop, stats
from scalelab.config import load_params, strategies, to_dict
from scalelab.launch.local import LaunchError, run_ranks
from scalelab.runtime import dist, seeds
from scalelab.runtime.device import setup_process
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.repeats import repeat_totals, slowest_rank, timed_repeats
from scalelab.training import schedule, workloads
from scalelab.training.loop import Optim, build_loop

METHOD = """\
The study's default workload (params.yaml `speedup`: model, features, classes, per-rank batch,
seed, fp32) on CPU with 1 torch thread per process. Two arms, built in the same process(es) from
the same seed, fed the same two synthetic batches (already in memory), alternating:
- `engine`: scalelab.training.loop.build_loop + Loop.step (what `scalelab train` and the study
  time), SGD lr 1e-3 momentum 0.9 (the study's optimizer), gradient clipping at norm `clip` and a
  warm-up + cosine LR schedule (train.grad_clip_norm, train.lr_schedule);
- `plain`: scalelab.bench.plain_loop, a hand-written loop that imports nothing from scalelab
  (nn.Sequential MLP, torch.optim.SGD, F.cross_entropy, backward, clip_grad_norm_, step, a
  LambdaLR with the same formula; DDP, or FSDP2's fully_shard of each layer, when the process
  group is up).
Strategies: `single` (one process), `ddp` and `fsdp` (torchrun, `--nproc` processes, gloo). Each repeat
runs `--steps` steps of each arm interleaved step by step (engine, plain, plain, engine, ...: the
order alternates), each step timed after a barrier; a repeat's time per arm is the sum over its
steps, taken on the slowest rank. The figure is the median over repeats of
engine/plain per-repeat step time, with a percentile bootstrap 95% interval (2000 resamples of
whole repeats, seed 0). Weights: fresh arms from the seed run `--check-steps` steps on the same
batches and the same dropout RNG state; every parameter and buffer is compared bit for bit on
every rank (`bitwise_identical`).
"""
OUT_FILE = "parity.json"
TARGET_RATIO = 1.01
CLIP = 0.5  # below the gradient norms of this workload: the clipping scales every step
SCHEDULE = (1000, 3, 0.1)  # total steps, warm-up steps, min lr ratio
ARMS = ("engine", "plain")


class ParityError(RuntimeError):
    """The engine's weights differ from the plain loop's: it adds math, not just bookkeeping."""

    exit_status = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml", help="its `speedup` section is the workload")
    parser.add_argument("--repeats", type=int, default=11, help="timed repeats of every arm (default: 11)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per arm and repeat")
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed steps after the check (default: 2)")
    parser.add_argument("--check-steps", type=int, default=5, help="steps before the bitwise weight check")
    parser.add_argument(
        "--strategies",
        nargs="+",
        choices=["single", "ddp", "fsdp"],
        default=["single", "ddp", "fsdp"],
        help="the strategies compared with their hand-written loops (default: all three)",
    )
    parser.add_argument("--nproc", type=int, default=2, help="ddp processes")
    parser.add_argument("--batch-size", type=int, default=0, help="per rank; 0: speedup.batch_sizes[0]")
    parser.add_argument("--num-features", type=int, default=0, help="0: speedup.num_features")
    parser.add_argument("--hidden", type=int, nargs="+", default=None, help="default: speedup.model.hidden")


def workload_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The study's default workload from params, with the command line's size overrides."""
    cfg = load_params(args.params).speedup
    if cfg.workload != "mlp":
        raise ValueError(f"speedup.workload = {cfg.workload!r}: the plain loop of the parity benchmark is an mlp")
    model = {**to_dict(cfg)["model"]}
    model["hidden"] = args.hidden or model.get("hidden", [256, 256])
    model.setdefault("dropout", 0.0)
    return {
        "model": model,
        "num_features": args.num_features or cfg.num_features,
        "num_classes": cfg.num_classes,
        "batch_size": args.batch_size or cfg.batch_sizes[0],
        "seed": cfg.seed,
        "lr": 1e-3,
        "momentum": 0.9,
        "clip": CLIP,
        "schedule": list(SCHEDULE),
        "repeats": args.repeats,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "check_steps": args.check_steps,
    }


# ---- one rank (runs in the worker processes) ----


class _Engine:
    def __init__(self, spec: dict[str, Any], device: torch.device, strategy: str) -> None:
        seeds.seed_all(spec["seed"])
        wl = workloads.load(
            "mlp", spec["model"], input_shape=[spec["num_features"]], num_classes=spec["num_classes"], key="speedup"
        )
        optim = Optim(name="sgd", lr=spec["lr"], momentum=spec["momentum"])
        total, warmup, min_ratio = spec["schedule"]
        cosine = functools.partial(
            schedule.build, total_steps=total, schedule="cosine", warmup_steps=warmup, min_ratio=min_ratio
        )
        self.loop = build_loop(
            wl,
            device,
            strategy_name=strategy,
            precision="fp32",
            optim=optim,
            schedule=cosine,
            clip_norm=spec["clip"],
        )

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loop.step([(x, y)])

    def weights(self) -> dict[str, torch.Tensor]:
        """This rank's parameters and buffers (under fsdp its shards)."""
        state = self.loop.workload.model.state_dict()
        return {k: v.to_local() if hasattr(v, "to_local") else v for k, v in state.items()}


def _plain(spec: dict[str, Any], strategy: str) -> plain_loop.PlainLoop:
    torch.manual_seed(spec["seed"])
    model = plain_loop.build_model(
        spec["num_features"], spec["model"]["hidden"], spec["num_classes"], spec["model"]["dropout"]
    )
    return plain_loop.PlainLoop(
        model,
        lr=spec["lr"],
        momentum=spec["momentum"],
        fsdp=strategies.get(strategy).sharded,
        clip=spec["clip"],
        schedule=tuple(spec["schedule"]),
    )


def _arms(spec: dict[str, Any], device: torch.device, strategy: str) -> dict[str, Any]:
    return {"engine": _Engine(spec, device, strategy), "plain": _plain(spec, strategy)}


def _run(arm: Any, batches: list[tuple[torch.Tensor, torch.Tensor]], steps: int) -> None:
    for i in range(steps):
        arm.step(*batches[i % len(batches)])


def _compare(arms: dict[str, Any]) -> dict[str, Any]:
    """Bit-for-bit comparison of the two arms' weights on this rank."""
    a, b = arms["engine"].weights(), arms["plain"].weights()
    same_keys = list(a) == list(b)
    equal = same_keys and all(torch.equal(a[k], b[k]) for k in a)
    diff = max((float((a[k] - b[k]).abs().max()) for k in a if k in b and a[k].shape == b[k].shape), default=0.0)
    return {"identical": bool(equal), "max_abs_diff": diff, "same_keys": same_keys}


def _timed(arms: dict[str, Any], batches: list[Any], spec: dict[str, Any]) -> dict[str, list[float]]:
    """Per-repeat seconds of each arm on this rank, the arms interleaved step by step (so that a
    burst of load hits both arms), each step after a barrier."""
    steps = {name: (lambda i, arm=arms[name]: arm.step(*batches[i % len(batches)])) for name in ARMS}
    times = timed_repeats(steps, repeats=spec["repeats"], steps=spec["steps"], interleave="step")
    return {name: repeat_totals(times[name]) for name in ARMS}


def _measure_arms(spec: dict[str, Any], strategy: str, device: torch.device, rank: int) -> dict[str, Any]:
    """Builds both arms, checks their weights, times them. The arms (and their DDP reducers) are
    freed when this returns: a reducer freed after its process group can deadlock at exit."""
    rank_seed = seeds.rank_seed(spec["seed"], rank)
    gen = torch.Generator().manual_seed(rank_seed)
    n, f, c = spec["batch_size"], spec["num_features"], spec["num_classes"]
    batches = [(torch.randn(n, f, generator=gen), torch.randint(c, (n,), generator=gen)) for _ in range(2)]
    arms = _arms(spec, device, strategy)
    for name in ARMS:  # the same dropout stream in both arms
        torch.manual_seed(rank_seed)
        _run(arms[name], batches, spec["check_steps"])
    check = _compare(arms)
    for name in ARMS:
        _run(arms[name], batches, spec["warmup_steps"])
    return {
        "check": check,
        "times": _timed(arms, batches, spec),
        "num_params": sum(p.numel() for p in arms["plain"].model.parameters()),  # a DTensor counts whole
    }


def measure_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """Bitwise check, then interleaved timed repeats; returns per-repeat step times (s) of the
    slowest rank, and every rank's weight check."""
    env = dist.read_env()
    device = setup_process(env, device="cpu", threads=1, timeout_s=spec.get("collective_timeout_s", 120.0))
    mine = _measure_arms(spec, spec["strategy"], device, env.rank)
    checks = dist.all_gather_object(mine["check"])
    slowest = {name: [s / spec["steps"] for s in slowest_rank(mine["times"][name])] for name in ARMS}
    dist.shutdown()
    return {
        "step_s": slowest,
        "bitwise_identical": all(check["identical"] for check in checks),
        "max_abs_weight_diff": max(check["max_abs_diff"] for check in checks),
        "ranks": env.world_size,
        "num_params": mine["num_params"],
        "is_main": env.is_main,
    }


# ---- the benchmark (runs in `scalelab bench parity`) ----


def run_strategy(spec: dict[str, Any], strategy: str, nproc: int, folder: Path) -> dict[str, Any]:
    """Runs one strategy's ranks in fresh processes; returns rank 0's result."""
    ranks = {"nproc": nproc if strategies.get(strategy).distributed else None, "threads_per_process": 1}
    try:
        return run_ranks(["bench-worker", "parity"], {**spec, "strategy": strategy}, folder, strategy, **ranks)
    except LaunchError as exc:
        raise LaunchError(f"parity {strategy} ranks: {exc}") from exc


def summarize(spec: dict[str, Any], raw: dict[str, dict[str, Any]], nproc: int) -> dict[str, Any]:
    """Ratios with intervals per strategy, plus the method and the raw repeats."""
    per = {}
    for strategy, r in raw.items():
        ratio = stats.ratio_figures(r["step_s"]["engine"], r["step_s"]["plain"])
        per[strategy] = {
            **ratio,
            "world_size": r["ranks"],
            "median_step_ms": {arm: 1000.0 * stats.median(r["step_s"][arm]) for arm in ARMS},
            "repeat_step_ms": {arm: [1000.0 * s for s in r["step_s"][arm]] for arm in ARMS},
            "bitwise_identical": r["bitwise_identical"],
            "max_abs_weight_diff": r["max_abs_weight_diff"],
            "meets_target": ratio["median_ratio"] <= TARGET_RATIO,
        }
    first = next(iter(raw.values()))
    return {
        "benchmark": "parity",
        "method": METHOD.strip(),
        "workload": {
            "name": "mlp",
            **{k: spec[k] for k in ("model", "num_features", "num_classes", "batch_size", "seed")},
            "num_params": first["num_params"],
            "optimizer": {"name": "sgd", "lr": spec["lr"], "momentum": spec["momentum"]},
            "grad_clip_norm": spec["clip"],
            "lr_schedule": dict(zip(("total_steps", "warmup_steps", "min_lr_ratio"), spec["schedule"]))
            | {"kind": "cosine"},
            "precision": "fp32",
            "device": "cpu",
            "threads_per_process": 1,
            "ddp_processes": nproc,
            "backend": "gloo",
        },
        "repeats": spec["repeats"],
        "steps_per_repeat": spec["steps"],
        "warmup_steps": spec["warmup_steps"],
        "check_steps": spec["check_steps"],
        "strategies": per,
        "target_ratio": TARGET_RATIO,
        "meets_target": all(p["meets_target"] for p in per.values()),
        "bitwise_identical": all(p["bitwise_identical"] for p in per.values()),
        **stats.machine(),
        "torch": torch.__version__,
    }


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Measures every strategy, writes parity.json and the summary lines; raises ParityError
    (after writing them) when an arm's weights differ."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = workload_spec(args)
    with tempfile.TemporaryDirectory(prefix=".bench-parity-", dir=out_dir) as tmp:
        raw = {s: run_strategy(spec, s, args.nproc, Path(tmp)) for s in args.strategies}
    result = summarize(spec, raw, args.nproc)
    atomic_write_json(out_dir / OUT_FILE, result)
    for strategy, p in result["strategies"].items():
        low, high = p["ci95"]
        figure = (
            f"engine/plain step time {p['median_ratio']:.3f} (95% CI {low:.3f}-{high:.3f}), "
            f"{strategy} at {p['world_size']} process(es), weights bitwise identical: {p['bitwise_identical']}"
        )
        met = p["meets_target"] and p["bitwise_identical"]
        stats.write_summary_line(out_dir, f"parity_{strategy}", figure, f"<= {TARGET_RATIO} and identical", met)
    broken = [s for s, p in result["strategies"].items() if not p["bitwise_identical"]]
    if broken:
        raise ParityError(
            f"engine and plain loop weights differ after {spec['check_steps']} steps under {', '.join(broken)} "
            f"(max abs diff {result['strategies'][broken[0]]['max_abs_weight_diff']:.3g}); see {out_dir / OUT_FILE}"
        )
    return result


def headline(result: dict, out: Path) -> str:
    """One line with the figures and their units."""
    parts = []
    for strategy, p in result["strategies"].items():
        med = p["median_step_ms"]
        parts.append(
            f"{strategy} {p['median_ratio']:.3f} [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}] "
            f"(engine {med['engine']:.1f} ms, plain {med['plain']:.1f} ms, identical {p['bitwise_identical']})"
        )
    return f"engine parity (engine/plain step time): {'; '.join(parts)} -> {out / OUT_FILE}"
