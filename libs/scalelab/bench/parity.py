"""Engine parity: scalelab's training step against a hand-written PyTorch loop (plain_loop.py), same
everything, per strategy (ranks: `bench-worker parity`)."""

from __future__ import annotations

import functools
from typing import Any

import torch

from scalelab.bench import harness, plain_loop, stats
from scalelab.bench.harness import Goal, opt
from scalelab.config import load_params, strategies, to_dict
from scalelab.runtime import dist, seeds
from scalelab.runtime.repeats import slowest_rank, timed_repeats
from scalelab.training import schedule

METHOD = """\
The study's default workload (params.yaml `speedup`) on CPU, 1 thread per process. Two arms built
from the same seed in the same process(es), fed the same two synthetic batches: `engine`
(build_loop + Loop.step: SGD lr 1e-3 momentum 0.9, clipping at norm `clip`, warm-up + cosine LR)
and `plain` (bench/plain_loop.py, by hand, importing nothing from scalelab; DDP, or FSDP2's
fully_shard of each layer). Strategies single, ddp and fsdp (`--nproc` gloo processes). Each
repeat runs `--steps` steps of each arm interleaved step by step (the order alternating), each
after a barrier, on the slowest rank; busy repeats are retried or dropped. The figure: the median
over repeats of engine/plain step time with a bootstrap 95% interval. Weights: fresh arms run
`--check-steps` steps on the same batches and dropout RNG; every parameter and buffer is compared
bit for bit on every rank.
"""
GOAL = Goal("<=", 1.01, "<= 1.01 and identical")
CLIP = 0.5  # below the gradient norms of this workload: the clipping scales every step
SCHEDULE = (1000, 3, 0.1)  # total steps, warm-up steps, min lr ratio
ARMS = ("engine", "plain")


class ParityError(harness.Failed):
    """The engine's weights differ from the plain loop's: it adds math, not just bookkeeping."""


def workload_spec(args: Any) -> dict[str, Any]:
    """The study's default workload from params, with the command line's size overrides."""
    cfg = load_params(args.params).speedup
    if cfg.workload != "mlp":
        raise ValueError(f"speedup.workload = {cfg.workload!r}: the plain loop of the parity benchmark is an mlp")
    model = {**to_dict(cfg)["model"]}
    model["hidden"] = args.hidden or model.get("hidden", [256, 256])
    model.setdefault("dropout", 0.0)
    features = args.num_features or cfg.num_features
    return {
        "workload": "mlp", "model": model, "num_features": features, "input_shape": [features],
        "num_classes": cfg.num_classes, "batch_size": args.batch_size or cfg.batch_sizes[0], "seed": cfg.seed,
        "optim": {"name": "sgd", "lr": 1e-3, "momentum": 0.9}, "clip": CLIP, "schedule": list(SCHEDULE),
        "steps": args.steps, "warmup_steps": args.warmup_steps, "check_steps": args.check_steps,
    }  # fmt: skip


def _local(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.to_local() if hasattr(v, "to_local") else v for k, v in state.items()}  # fsdp: this rank's shards


def _compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Bit-for-bit comparison of two arms' weights on this rank."""
    same_keys = list(a) == list(b)
    equal = same_keys and all(torch.equal(a[k], b[k]) for k in a)
    diff = max((float((a[k] - b[k]).abs().max()) for k in a if k in b and a[k].shape == b[k].shape), default=0.0)
    return {"identical": bool(equal), "max_abs_diff": diff, "same_keys": same_keys}


def _measure_arms(spec: dict[str, Any]) -> dict[str, Any]:
    """Builds both arms, checks their weights, times them; the arms (and DDP reducers) go on return."""
    total, warmup, min_ratio = sched = spec["schedule"]
    cosine = functools.partial(schedule.build, total_steps=total, schedule="cosine", warmup_steps=warmup)
    cosine = functools.partial(cosine, min_ratio=min_ratio)
    rank = harness.rank_loop({**spec, "batch": spec["batch_size"]}, schedule=cosine, clip_norm=spec["clip"])
    torch.manual_seed(spec["seed"])
    widths, model = spec["model"]["hidden"], spec["model"]
    net = plain_loop.build_model(spec["num_features"], widths, spec["num_classes"], model["dropout"])
    sharded, clip = strategies.get(spec["strategy"]).sharded, spec["clip"]
    plain = plain_loop.PlainLoop(net, lr=1e-3, momentum=0.9, fsdp=sharded, clip=clip, schedule=tuple(sched))
    batches = rank.batches
    step = {"engine": lambda i: rank.loop.step([batches[i % 2]]), "plain": lambda i: plain.step(*batches[i % 2])}
    rank_seed = seeds.rank_seed(spec["seed"], rank.env.rank)
    for name in ARMS:  # the same dropout stream in both arms
        torch.manual_seed(rank_seed)
        for i in range(spec["check_steps"]):
            step[name](i)
    check = _compare(_local(rank.loop.workload.model.state_dict()), plain.weights())
    for name in ARMS:
        for i in range(spec["warmup_steps"]):
            step[name](i)

    def take(i: int) -> dict[str, float]:  # one repeat: both arms step by step, the order alternating
        order = ARMS if i % 2 == 0 else ARMS[::-1]
        times = timed_repeats({n: step[n] for n in order}, repeats=1, steps=spec["steps"], interleave="step")
        return {n: slowest_rank([sum(times[n][0])])[0] / spec["steps"] for n in ARMS}

    reps = harness.take_repeats(take, spec["busy"])
    return {
        "step_s": {n: [r[n] for r in reps.kept] for n in ARMS},
        **reps.json(),
        "checks": dist.all_gather_object(check),
        "num_params": sum(p.numel() for p in plain.model.parameters()),  # a DTensor counts whole
        "ranks": rank.env.world_size,
        "is_main": rank.env.is_main,
    }


def measure_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """Bitwise check, then interleaved timed repeats; per-repeat step times (s) of the slowest rank."""
    got = _measure_arms(spec)
    dist.shutdown()
    checks = got.pop("checks")
    return {
        **got,
        "bitwise_identical": all(c["identical"] for c in checks),
        "max_abs_weight_diff": max(c["max_abs_diff"] for c in checks),
    }


def measure(ctx: harness.Context) -> dict[str, Any]:
    """Measures every strategy; raises ParityError (after its JSON) when an arm's weights differ."""
    args, spec = ctx.args, workload_spec(ctx.args)
    per = {}
    for s in args.strategies:
        r = ctx.ranks("parity", {**spec, "strategy": s, "busy": ctx.policy()}, s, nproc=harness.ranks_of(s, args.nproc))
        ratio = stats.ratio_figures(r["step_s"]["engine"], r["step_s"]["plain"])
        same = r["bitwise_identical"]
        per[s] = {
            **ratio, "world_size": r["ranks"],
            "median_step_ms": {arm: 1000.0 * stats.median(r["step_s"][arm]) for arm in ARMS},
            "repeat_step_ms": {arm: [1000.0 * x for x in r["step_s"][arm]] for arm in ARMS},
            "bitwise_identical": same, "max_abs_weight_diff": r["max_abs_weight_diff"],
            "meets_target": GOAL.met(ratio["median_ratio"]), "dropped": r["dropped"], "disturbance": r["disturbance"],
        }  # fmt: skip
        figure = f"engine/plain step time {stats.ratio_text(ratio)}, {s} at {r['ranks']} process(es), weights bitwise "
        figure += f"identical: {same}"
        ctx.figure(f"parity_{s}", figure, ratio["median_ratio"], GOAL, also=same, dropped=r["dropped"])
    workload = {k: spec[k] for k in ("model", "num_features", "num_classes", "batch_size", "seed")}
    result = {
        "workload": {
            "name": "mlp", **workload, "num_params": r["num_params"], "optimizer": spec["optim"],
            "grad_clip_norm": spec["clip"], "precision": "fp32", "device": "cpu", "threads_per_process": 1,
            "lr_schedule": dict(zip(("total_steps", "warmup_steps", "min_lr_ratio"), SCHEDULE)) | {"kind": "cosine"},
            "ddp_processes": args.nproc, "backend": "gloo",
        },
        "repeats": args.repeats, "steps_per_repeat": args.steps, "warmup_steps": args.warmup_steps,
        "check_steps": args.check_steps, "strategies": per, "target_ratio": GOAL.target,
        "meets_target": all(p["meets_target"] for p in per.values()),
        "bitwise_identical": all(p["bitwise_identical"] for p in per.values()), "torch": torch.__version__,
    }  # fmt: skip
    broken = [s for s, p in per.items() if not p["bitwise_identical"]]
    if broken:
        raise ParityError(
            f"engine and plain loop weights differ after {args.check_steps} steps under {', '.join(broken)} "
            f"(max abs diff {per[broken[0]]['max_abs_weight_diff']:.3g}); see {ctx.out / BENCH.out_file}",
            result,
        )
    return result


OPTIONS = (
    opt("--params", "params.yaml", "its `speedup` section is the workload"),
    opt("--repeats", 11, "timed repeats of every arm"),
    opt("--steps", 3, "timed steps per arm and repeat"),
    opt("--warmup-steps", 2, "untimed steps after the check"),
    opt("--check-steps", 5, "steps before the bitwise weight check"),
    opt("--strategies", ["single", "ddp", "fsdp"], "the strategies compared with hand-written loops"),
    opt("--nproc", 2, "processes of a distributed strategy"),
    opt("--batch-size", 0, "per rank; 0: speedup.batch_sizes[0]"),
    opt("--num-features", 0, "0: speedup.num_features"),
    opt("--hidden", None, "hidden widths; default: speedup.model.hidden", type=int, nargs="+"),
)
BENCH = harness.Benchmark("parity", "parity.json", METHOD, measure, OPTIONS)
