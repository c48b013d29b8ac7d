"""Checkpoint save and load per rank against model size: ddp's full state against fsdp's shards at
1 and 2 ranks, and fsdp's asynchronous save; seconds and peak memory per rank (`bench-worker checkpoint`)."""

from __future__ import annotations

import functools
import itertools
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from scalelab.bench import harness
from scalelab.bench.harness import Goal, opt
from scalelab.config import Params, build
from scalelab.runtime import dist, memory
from scalelab.runtime.device import setup_process
from scalelab.training import job
from scalelab.training.checkpoint import Checkpointer, checkpoint_state, restore
from scalelab.training.loop import Loop, Optim, build_loop

METHOD = """\
The gpt workload (4 blocks, 4 heads, vocabulary 256, d_model sized to the parameter count), AdamW after one step (state
3x the weights), gloo on the CPU, 1 thread a rank. `ddp`: the job's path (state gathered on rank 0, torch.save, an
atomic write; every rank loads the file); `fsdp`: every rank writes its shards with torch.distributed.checkpoint, rank
0 commits; every rank loads and reshards; `fsdp-async`: `save_s` is how long the step is blocked, `commit_s` until
committed. Per size: `repeats` saves, each followed by a load (busy repeats retried or dropped); a figure: the median
over repeats of the slowest rank. Peak memory: the largest rank's VmHWM growth (reset before each) in a save and its
commit, a load, and the build (fsdp builds on the meta device). Files go to a local disk (page cache).
"""
GPT = {"layers": 4, "heads": 4, "seq_len": 64, "vocab_size": 256}
ARMS = ["ddp", "fsdp", "fsdp-async"]
SECONDS = ("save_s", "commit_s", "load_s")
GOAL = Goal("<=", 0.6)  # fsdp save time per rank, 2 ranks over 1 (1/N would be 0.5)


def _loop(strategy: str, params: int, device: torch.device, env: dist.DistEnv) -> tuple[Loop, int, int]:
    """The loop as `scalelab train` builds it (fsdp: on the meta device), after one step; its
    parameter count and this rank's peak memory growth while building."""
    d_model = max(round((params / (12 * GPT["layers"])) ** 0.5 / GPT["heads"]), 1) * GPT["heads"]  # 12 d_model^2/block
    cfg = {**GPT, "d_model": d_model}
    train = build(Params, {"train": {"workload": "gpt", "model": cfg, "strategy": strategy, "seed": 0}})
    manifest = {"input_shape": [cfg["seq_len"]], "num_classes": cfg["vocab_size"]}
    base = memory.reset_peak(trim=True)
    wl, init_state = job.build_workload(train, manifest, env, resuming_shards=False)
    optim = Optim(name="adamw")
    loop = build_loop(wl, device, strategy_name=strategy, precision="fp32", optim=optim, init_state=init_state)
    build_peak = memory.peak_since(base)
    del init_state
    loop.step([wl.synthetic_batch(4)])  # AdamW's moment buffers exist from here
    return loop, sum(p.numel() for p in loop.model.parameters()), build_peak  # a DTensor counts whole


def _repeat(loop: Loop, ckpt: Checkpointer, env: dist.DistEnv, rep: int) -> dict[str, Any]:
    """One timed save, its commit, and a load, with this rank's peak memory in each."""
    dist.barrier()
    base, start = memory.reset_peak(trim=True), time.perf_counter()
    state, shards = checkpoint_state(loop, 0, None, {})
    if env.is_main or shards is not None:
        ckpt.save(rep + 1, state, shards)
    got = {"save_s": time.perf_counter() - start}  # the training thread is free again
    ckpt.wait()
    got["peak_bytes"] = memory.peak_since(base)
    dist.barrier()
    got["commit_s"] = time.perf_counter() - start
    del state, shards
    base, start = memory.reset_peak(trim=True), time.perf_counter()
    restore(ckpt.load_latest(), loop, 0, env, {})
    got["load_peak_bytes"] = memory.peak_since(base)
    dist.barrier()
    return got | {"load_s": time.perf_counter() - start}


def measure_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank: per arm and size, `repeats` timed saves and loads; a row each of the slowest rank's
    median seconds and every rank's peak memory."""
    env = dist.read_env()
    device = setup_process(env, device="cpu", threads=1, timeout_s=600.0)
    rows, dropped = [], []
    for arm, params in itertools.product(ARMS, spec["params"]):
        loop, count, build_peak = _loop(arm.removesuffix("-async"), params, device, env)
        folder = Path(spec["work"]) / f"{arm}-{params}-w{env.world_size}"
        ckpt = Checkpointer(folder, "bench", keep=1, asynchronous=arm.endswith("-async"))
        reps = harness.take_repeats(functools.partial(_repeat, loop, ckpt, env), spec["busy"])
        ranks = dist.all_gather_object({"kept": reps.kept, "build": build_peak})  # the same repeats on every rank
        slowest = [{k: max(r["kept"][i][k] for r in ranks) for k in SECONDS} for i in range(len(reps.kept))]
        row = {"strategy": arm, "world_size": env.world_size, "parameters": count, "state_bytes": 12 * count}
        row |= {k: statistics.median(s[k] for s in slowest) for k in SECONDS}  # state_bytes: fp32 + AdamW
        row["peak_save_bytes_per_rank"] = max(rep["peak_bytes"] for r in ranks for rep in r["kept"])
        row["peak_load_bytes_by_rank"] = [max(rep["load_peak_bytes"] for rep in r["kept"]) for r in ranks]
        rows.append(row | {"peak_build_bytes_by_rank": [r["build"] for r in ranks]})
        dropped += reps.dropped
        dist.barrier()
        if env.is_main:
            shutil.rmtree(folder, ignore_errors=True)
    return {"rows": rows, "dropped": dropped, "is_main": env.is_main}


def measure(ctx: harness.Context) -> dict[str, Any]:
    """Every arm and size at each world size; the figure: fsdp's save per rank at the largest size, 2 ranks / 1."""
    args, spec = ctx.args, {"params": ctx.args.ckpt_params, "busy": ctx.policy(), "work": str(ctx.work)}
    runs = [ctx.ranks("checkpoint", spec, f"w{world}", nproc=world) for world in args.ckpt_ranks]
    rows, dropped = [row for run in runs for row in run["rows"]], [d for run in runs for d in run["dropped"]]
    largest = max(r["parameters"] for r in rows)
    at = [r for r in rows if r["parameters"] == largest]
    fsdp = {r["world_size"]: r["save_s"] for r in at if r["strategy"] == ARMS[1]}
    ratio = fsdp[2] / fsdp[1] if {1, 2} <= set(fsdp) else None
    blocked = max((r["save_s"] / r["commit_s"] for r in at if r["strategy"] == ARMS[2]), default=None)
    cells = "; ".join(
        f"{r['strategy']} w{r['world_size']} save {r['save_s']:.2f} s (committed {r['commit_s']:.2f}), "
        f"load {r['load_s']:.2f} s, peak {r['peak_save_bytes_per_rank'] / 2**20:.0f} MiB"
        for r in at
    )
    text = f"fsdp save per rank, 2 ranks / 1, gpt of {largest:,} parameters: "
    text += "not measured: needs world sizes 1 and 2" if ratio is None else f"{ratio:.2f} ({cells})"
    ctx.figure("checkpoint_fsdp_save_2_over_1", text, ratio, GOAL, dropped=dropped)
    goal = {"parameters": largest, "fsdp_save_2_over_1": ratio, "async_blocked_fraction": blocked}
    return {"repeats": args.repeats, "rows": rows, "goal": goal, "dropped": dropped}


OPTIONS = (
    opt("--ckpt-params", [10**5, 10**6, 10**7], "parameter counts (about)"),
    opt("--ckpt-ranks", [1, 2], "world sizes"),
    opt("--repeats", 3, "timed saves and loads per size"),
)
BENCH = harness.Benchmark("checkpoint", "checkpoint.json", METHOD, measure, OPTIONS)
