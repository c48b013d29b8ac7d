"""Checkpoint save and load per rank against model size: ddp's full state (one file from rank 0)
against fsdp's shards (torch.distributed.checkpoint, every rank its own), at 1 and 2 ranks, and
fsdp's asynchronous save (train.async_checkpoint) against its synchronous one.

Each rank reports its save and load seconds and its peak resident memory above the baseline
while saving (VmHWM, reset before each save). One by hand, with a spec.json that `run` wrote:

    torchrun --standalone --nproc-per-node 2 -m scalelab.cli bench-worker checkpoint --spec SPEC.json --out OUT.json
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from scalelab.config import Params, build, strategies
from scalelab.launch.local import LaunchError, run_ranks
from scalelab.runtime import dist, memory
from scalelab.runtime.device import setup_process
from scalelab.runtime.io import atomic_write_json
from scalelab.training import job
from scalelab.training.checkpoint import Checkpointer, checkpoint_state, restore
from scalelab.training.loop import Loop, Optim, build_loop

METHOD = """\
The gpt workload (4 blocks, 4 heads, vocabulary 256, d_model sized to the parameter count), AdamW
after one step (its two moment buffers: the state is 3x the weights), gloo on the CPU, one torch
thread a rank. `ddp`: the job's path (the state gathered on rank 0, torch.save, an atomic write;
every rank loads the file); `fsdp`: each block a shard unit, every rank writes its shards with
torch.distributed.checkpoint and rank 0 commits the folder; every rank loads and reshards. Per
size: `repeats` saves, each followed by a load; a figure is the median over repeats of the
slowest rank. Building (the job's path: fsdp builds on the meta device, rank 0 makes the initial
state on its CPU and each rank receives its shards) and loading report each rank's peak too.
`fsdp-async`: `save_s` is how long the training thread is blocked (DCP's
async_save stages a copy), `commit_s` until the background write is committed. Peak memory: the
largest rank's VmHWM growth during a save and its commit (reset before it): what the save itself
holds besides the live model (the async arm's staged copy included). Files go to a local disk, in
the page cache."""
GPT = {"layers": 4, "heads": 4, "seq_len": 64, "vocab_size": 256}
ARMS = ["ddp", "fsdp", "fsdp-async"]
GOAL_RATIO = 0.6  # fsdp save time per rank, 2 ranks over 1 (1/N would be 0.5)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ckpt-params", type=int, nargs="+", default=[10**5, 10**6, 10**7], help="parameter counts (about)"
    )
    parser.add_argument("--ckpt-ranks", type=int, nargs="+", default=[1, 2], help="world sizes")
    parser.add_argument("--repeats", type=int, default=3, help="timed saves and loads per size (default: 3)")


def gpt_config(params: int) -> dict[str, Any]:
    """The gpt Config of about `params` parameters (12 d_model^2 a block)."""
    d_model = max(round((params / (12 * GPT["layers"])) ** 0.5 / GPT["heads"]), 1) * GPT["heads"]
    return {**GPT, "d_model": d_model}


def measure_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank: for each strategy and size, `repeats` timed saves and loads; returns every
    rank's figures (rank 0 writes them)."""
    env = dist.read_env()
    device = setup_process(env, device="cpu", threads=1, timeout_s=600.0)
    work = Path(spec["work"])
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    for arm in spec["arms"]:
        strategy, asynchronous = arm.removesuffix("-async"), arm.endswith("-async")
        for params in spec["params"]:
            loop, count, build_peak = _loop(strategy, params, device, env)
            ckpt = Checkpointer(work / f"{arm}-{params}-w{env.world_size}", "bench", keep=1, asynchronous=asynchronous)
            got: dict[str, Any] = {"save_s": [], "commit_s": [], "load_s": [], "peak_bytes": [], "load_peak_bytes": []}
            got.update(parameters=count, build_peak_bytes=build_peak)
            for rep in range(spec["repeats"]):
                dist.barrier()
                base = memory.reset_peak(trim=True)
                start = time.perf_counter()
                state, shards = checkpoint_state(loop, 0, None, {})
                if env.is_main or shards is not None:
                    ckpt.save(rep + 1, state, shards)
                got["save_s"].append(time.perf_counter() - start)  # the training thread is free again
                ckpt.wait()
                got["peak_bytes"].append(memory.peak_since(base))
                dist.barrier()
                got["commit_s"].append(time.perf_counter() - start)
                del state, shards
                base = memory.reset_peak(trim=True)
                start = time.perf_counter()
                restore(ckpt.load_latest(), loop, 0, env, {})
                got["load_peak_bytes"].append(memory.peak_since(base))
                dist.barrier()
                got["load_s"].append(time.perf_counter() - start)
            figures.setdefault(arm, {})[str(params)] = got
            dist.barrier()
            if env.is_main:
                shutil.rmtree(ckpt.folder, ignore_errors=True)
    return {"ranks": dist.all_gather_object(figures), "is_main": env.is_main}


def _loop(strategy: str, params: int, device: torch.device, env: dist.DistEnv) -> tuple[Loop, int, int]:
    """The model built as `scalelab train` builds it (fsdp: on the meta device, then each rank's
    shards from rank 0's initial state), after one step; its parameter count and the bytes this
    rank's resident memory peaked at above its start while building."""
    cfg = gpt_config(params)
    train = build(Params, {"train": {"workload": "gpt", "model": cfg, "strategy": strategy, "seed": 0}})
    manifest = {"input_shape": [cfg["seq_len"]], "num_classes": cfg["vocab_size"]}
    base = memory.reset_peak(trim=True)
    wl, init_state = job.build_workload(train, manifest, env, resuming_shards=False)
    loop = build_loop(
        wl, device, strategy_name=strategy, precision="fp32", optim=Optim(name="adamw"), init_state=init_state
    )
    build_peak = memory.peak_since(base)
    del init_state
    loop.step([wl.synthetic_batch(4)])  # AdamW's moment buffers exist from here
    return loop, sum(p.numel() for p in loop.model.parameters()), build_peak  # a DTensor counts whole


def measure(params: list[int], ranks: list[int], repeats: int, work: Path) -> list[dict[str, Any]]:
    """Runs the ranks at each world size; one row per strategy, world size and size."""
    rows = []
    for world in ranks:
        spec = {"params": params, "repeats": repeats, "arms": ARMS, "work": str(work)}
        try:
            raw = run_ranks(["bench-worker", "checkpoint"], spec, work, f"w{world}", nproc=world, threads_per_process=1)
        except LaunchError as exc:
            raise LaunchError(f"checkpoint ranks (world size {world}): {exc}") from exc
        rows += _rows(raw["ranks"], world, params)
    return rows


def _rows(ranks: list[dict], world: int, sizes: list[int]) -> list[dict[str, Any]]:
    """One row per strategy and size: the slowest rank's median seconds, the largest rank's peak."""
    rows = []
    for arm in ranks[0]:
        for params in sizes:
            per_rank = [r[arm][str(params)] for r in ranks]
            slowest = {
                k: [max(rep) for rep in zip(*(r[k] for r in per_rank))] for k in ("save_s", "commit_s", "load_s")
            }
            count = per_rank[0]["parameters"]
            rows.append(
                {
                    "strategy": arm,
                    "world_size": world,
                    "parameters": count,
                    "state_bytes": 3 * 4 * count,  # fp32 weights and AdamW's two moments
                    "save_s": statistics.median(slowest["save_s"]),
                    "commit_s": statistics.median(slowest["commit_s"]),
                    "load_s": statistics.median(slowest["load_s"]),
                    "peak_save_bytes_per_rank": max(max(r["peak_bytes"]) for r in per_rank),
                    "peak_load_bytes_by_rank": [max(r["load_peak_bytes"]) for r in per_rank],
                    "peak_build_bytes_by_rank": [r["build_peak_bytes"] for r in per_rank],
                }
            )
    return rows


def _goal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """fsdp's save time per rank at the largest size, 2 ranks over 1."""
    largest = max(r["parameters"] for r in rows)
    fsdp = {
        r["world_size"]: r["save_s"]
        for r in rows
        if r["strategy"] in strategies.STRATEGIES
        and strategies.get(r["strategy"]).sharded
        and r["parameters"] == largest
    }
    blocked = [
        r["save_s"] / r["commit_s"] for r in rows if r["strategy"] == "fsdp-async" and r["parameters"] == largest
    ]
    if not {1, 2} <= set(fsdp):
        return {"met": None, "note": "needs world sizes 1 and 2"}
    ratio = fsdp[2] / fsdp[1]
    return {
        "parameters": largest,
        "fsdp_save_2_over_1": ratio,
        "target": GOAL_RATIO,
        "met": ratio <= GOAL_RATIO,
        "async_blocked_fraction": max(blocked) if blocked else None,
    }


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    work = out_dir / "checkpoint-work"
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows = measure(args.ckpt_params, args.ckpt_ranks, args.repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"method": METHOD, "repeats": args.repeats, "rows": rows, "goal": _goal(rows)}
    atomic_write_json(out_dir / "checkpoint.json", result)
    return result


def headline(result: dict, out: Path) -> str:
    goal = result["goal"]
    largest = max(r["parameters"] for r in result["rows"])
    cells = [
        f"{r['strategy']} w{r['world_size']}: save {r['save_s']:.2f} s (committed {r['commit_s']:.2f}), "
        f"load {r['load_s']:.2f} s, "
        f"peak {r['peak_save_bytes_per_rank'] / 2**20:.0f} MiB"
        for r in result["rows"]
        if r["parameters"] == largest
    ]
    if goal["met"] is None:
        verdict = "not measured"
    else:
        verdict = f"{goal['fsdp_save_2_over_1']:.2f} ({'met' if goal['met'] else 'not met'}, goal <= {GOAL_RATIO})"
    where = out / "checkpoint.json"
    return f"checkpoint, gpt of {largest:,} parameters: {'; '.join(cells)}; fsdp save 2 ranks / 1: {verdict} -> {where}"
