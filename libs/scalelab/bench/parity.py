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
The study's default workload (params.yaml `speedup`) on CPU, 1 thread a process, in two arms from the same
seed and the same two synthetic batches: `engine` (build_loop + Loop.step) and `plain` (bench/plain_loop.py:
DDP, or FSDP2's fully_shard of each layer), both SGD lr 1e-3 momentum 0.9 clipped at norm 0.5 with a
warm-up + cosine LR; ddp and fsdp at 2 gloo processes. After the check steps (same batches, same dropout
RNG) every parameter and buffer is compared bit for bit on every rank. A repeat: the arms' steps
interleaved step by step (order alternating), each after a barrier, on the slowest rank; busy repeats
retried or dropped. The figure: the median over repeats of engine/plain step time, bootstrap 95% interval.
"""
GOAL = Goal("<=", 1.01, "<= 1.01 and identical")
CLIP = 0.5  # below the gradient norms of this workload: the clipping scales every step
SCHEDULE = {"total_steps": 1000, "warmup_steps": 3, "min_ratio": 0.1}  # cosine, with a linear warm-up
OPTIM = {"name": "sgd", "lr": 1e-3, "momentum": 0.9}
ARMS = ("engine", "plain")
NPROC = 2  # processes of a distributed strategy


class ParityError(harness.Failed):
    """The engine's weights differ from the plain loop's: it adds math, not just bookkeeping."""


def workload_spec(args: Any) -> dict[str, Any]:
    """The study's default workload from params, with the command line's size overrides."""
    cfg = load_params(args.params).speedup
    if cfg.workload != "mlp":
        raise ValueError(f"speedup.workload = {cfg.workload!r}: the plain loop of the parity benchmark is an mlp")
    model = {"dropout": 0.0, **to_dict(cfg)["model"]}
    model["hidden"] = args.hidden or model.get("hidden", [256, 256])
    features = args.num_features or cfg.num_features
    return {
        "workload": "mlp", "model": model, "num_features": features, "input_shape": [features],
        "num_classes": cfg.num_classes, "batch_size": args.batch_size or cfg.batch_sizes[0], "seed": cfg.seed,
        "optim": OPTIM, "steps": args.steps, "warmup_steps": args.warmup_steps, "check_steps": args.check_steps,
    }  # fmt: skip


def _compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Bit-for-bit comparison of two arms' weights on this rank."""
    diff = max((float((a[k] - b[k]).abs().max()) for k in a if k in b and a[k].shape == b[k].shape), default=0.0)
    return {"identical": list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), "max_abs_diff": diff}


def _measure_arms(spec: dict[str, Any]) -> dict[str, Any]:
    """Builds both arms, checks their weights on every rank, times them."""
    cosine = functools.partial(schedule.build, schedule="cosine", **SCHEDULE)
    rank = harness.rank_loop({**spec, "batch": spec["batch_size"]}, schedule=cosine, clip_norm=CLIP)
    torch.manual_seed(spec["seed"])
    model, facts = spec["model"], strategies.get(spec["strategy"])
    net = plain_loop.build_model(spec["num_features"], model["hidden"], spec["num_classes"], model["dropout"])
    wrap = {"ddp": facts.distributed and not facts.sharded, "fsdp": facts.sharded}  # the registry's facts
    plain = plain_loop.PlainLoop(net, OPTIM, CLIP, SCHEDULE, **wrap)
    batches = rank.batches
    step = {"engine": lambda i: rank.loop.step([batches[i % 2]]), "plain": lambda i: plain.step(*batches[i % 2])}
    for name in ARMS:  # the same dropout stream in both arms
        torch.manual_seed(seeds.rank_seed(spec["seed"], rank.env.rank))
        for i in range(spec["check_steps"]):
            step[name](i)
    checks = dist.all_gather_object(_compare(plain_loop.local_state(rank.loop.workload.model), plain.weights()))
    for name in ARMS:
        for i in range(spec["warmup_steps"]):
            step[name](i)

    def take(i: int) -> dict[str, float]:  # one repeat: both arms step by step, the order alternating
        times = timed_repeats(
            {n: step[n] for n in harness.rotated(ARMS, i)}, repeats=1, steps=spec["steps"], interleave="step"
        )
        return {n: slowest_rank([sum(times[n][0])])[0] / spec["steps"] for n in ARMS}

    reps = harness.take_repeats(take, spec["busy"])
    return {
        "step_s": {n: [r[n] for r in reps.kept] for n in ARMS}, **reps.json(),
        "bitwise_identical": all(c["identical"] for c in checks),
        "max_abs_weight_diff": max(c["max_abs_diff"] for c in checks),
        "num_params": sum(p.numel() for p in net.parameters()),  # a DTensor counts whole
        "ranks": rank.env.world_size, "is_main": rank.env.is_main,
    }  # fmt: skip


def measure_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """Bitwise check, then interleaved timed repeats; per-repeat step times (s) of the slowest rank."""
    got = _measure_arms(spec)  # the arms (and DDP reducers) are gone on its return
    dist.shutdown()
    return got


def measure(ctx: harness.Context) -> dict[str, Any]:
    """Measures every strategy; raises ParityError (after its JSON) when an arm's weights differ."""
    args, spec, per = ctx.args, workload_spec(ctx.args), {}
    for s in args.strategies:
        r = ctx.ranks("parity", {**spec, "strategy": s, "busy": ctx.policy()}, s, nproc=harness.ranks_of(s, NPROC))
        step_s, same = r["step_s"], r["bitwise_identical"]
        ratio = stats.ratio_figures(step_s["engine"], step_s["plain"])
        per[s] = {
            **ratio, "world_size": r["ranks"],
            "median_step_ms": {arm: 1000.0 * stats.median(step_s[arm]) for arm in ARMS},
            "repeat_step_ms": {arm: [1000.0 * x for x in step_s[arm]] for arm in ARMS},
            **{k: r[k] for k in ("bitwise_identical", "max_abs_weight_diff", "dropped", "disturbance")},
        }  # fmt: skip
        text = f"engine/plain step time {stats.ratio_text(ratio)}, {s} at {r['ranks']} process(es), weights bitwise "
        text += f"identical: {same}"
        ctx.figure(f"parity_{s}", text, ratio["median_ratio"], GOAL, also=same, dropped=r["dropped"])
    result = {
        "workload": {
            "name": "mlp", **{k: spec[k] for k in ("model", "num_features", "num_classes", "batch_size", "seed")},
            "num_params": r["num_params"], "optimizer": OPTIM, "grad_clip_norm": CLIP, "precision": "fp32",
            "device": "cpu", "threads_per_process": 1, "ddp_processes": NPROC, "backend": "gloo",
            "lr_schedule": {**SCHEDULE, "kind": "cosine"},
        },
        "repeats": args.repeats, "steps_per_repeat": args.steps, "warmup_steps": args.warmup_steps,
        "check_steps": args.check_steps, "strategies": per, "torch": torch.__version__,
        "bitwise_identical": all(p["bitwise_identical"] for p in per.values()),
    }  # fmt: skip
    if broken := [s for s, p in per.items() if not p["bitwise_identical"]]:
        diff = f"max abs diff {per[broken[0]]['max_abs_weight_diff']:.3g}"
        why = f"engine and plain loop weights differ after {args.check_steps} steps under {', '.join(broken)} ({diff})"
        raise ParityError(f"{why}; see {ctx.out / BENCH.out_file}", result)
    return result


OPTIONS = (
    opt("--params", "params.yaml", "its `speedup` section is the workload"),
    opt("--repeats", 11, "timed repeats of every arm"),
    opt("--steps", 3, "timed steps per arm and repeat"),
    opt("--warmup-steps", 2, "untimed steps after the check"),
    opt("--check-steps", 5, "steps before the bitwise weight check"),
    opt("--strategies", ["single", "ddp", "fsdp"], "the strategies compared with hand-written loops"),
    opt("--batch-size", 0, "per rank; 0: speedup.batch_sizes[0]"),
    opt("--num-features", 0, "0: speedup.num_features"),
    opt("--hidden", None, "hidden widths; default: speedup.model.hidden", type=int, nargs="+"),
)
BENCH = harness.Benchmark("parity", "parity.json", METHOD, measure, OPTIONS)
