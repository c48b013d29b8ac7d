"""One rank of `scalelab bench data`: start-up check, memory and loader wait on one prepared split.

    torchrun --standalone --nproc-per-node 2 -m scalelab.bench.data_rank SPEC.json OUT.json

What a training rank does, in order: `verify` (timed), `open_split` (memory-mapped), the GPT
workload under DDP (gloo, 1 thread), then a pass that fetches every sample of this rank's share in
batches of TOUCH_SAMPLES (so every page of the data has been read through the map), then the
loader arms: for each repeat and `num_workers` arm (order alternating), one `RunLoader` per arm for
the whole run (workers persistent, started in an untimed warm-up pass), `steps` training steps
timing `wait` (asking for the micro-batch -> having it) and `compute` (Loop.step). RssAnon (this
process's anonymous memory, /proc/self/status) is read before the data is opened, after the pass
and after the arms.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from scalelab.runtime import memory
from scalelab.runtime.io import atomic_write_json

TOUCH_SAMPLES = 128  # the size of a training fetch: the allocator reuses its blocks


def rss_anon_mb() -> float:
    """RssAnon of this process in MiB (Linux /proc/self/status)."""
    return memory.status_kib("RssAnon") / 1024


def _touch_every_sample(split: Any, env: Any) -> int:
    """Fetches this rank's share of the split once; returns the samples fetched."""
    from scalelab.training.sampler import RankBatches

    batch = max(min(TOUCH_SAMPLES, len(split) // env.world_size), 1)
    sampler = RankBatches(
        len(split),
        world_size=env.world_size,
        rank=env.rank,
        batch_size=batch,
        num_batches=len(split) // (batch * env.world_size),
        seed=0,
    )
    fetched = 0
    for indices in sampler:
        fetched += len(split.fetch(indices)[0])
    return fetched


def _timed_steps(loop: Any, loader: Any, epoch: int, steps: int) -> list[float]:
    """[wait_s, compute_s] over `steps` steps of one pass."""
    wait_s = compute_s = 0.0
    batches = loader.epoch(epoch)
    start = time.perf_counter()
    for _ in range(steps):
        micro = next(batches)
        got = time.perf_counter()
        loop.step([micro])
        done = time.perf_counter()
        wait_s, compute_s, start = wait_s + got - start, compute_s + done - got, done
    return [wait_s, compute_s]


def _loader_arms(spec: dict[str, Any], split: Any, loop: Any, plan: Any, env: Any) -> dict[str, list[list[float]]]:
    from scalelab.runtime import dist
    from scalelab.training.loader import RunLoader

    arms = [str(w) for w in spec["workers"]]
    loaders = {a: RunLoader(split, plan, env, seed=0, num_workers=int(a)) for a in arms}
    for arm in arms:  # untimed: first touch of the model, the optimizer and each loader's workers
        _timed_steps(loop, loaders[arm], 0, 2)
    times: dict[str, list[list[float]]] = {a: [] for a in arms}
    for rep in range(spec["repeats"]):
        for arm in arms if rep % 2 == 0 else arms[::-1]:
            dist.barrier()
            times[arm].append(_timed_steps(loop, loaders[arm], 1 + rep, spec["steps"]))
    for loader in loaders.values():
        loader.close()
    return times


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    from scalelab.data.store import open_split, verify
    from scalelab.runtime import dist, seeds
    from scalelab.runtime.device import setup_process
    from scalelab.training import workloads
    from scalelab.training.loop import Optim, build_loop
    from scalelab.training.plan import RunPlan

    env = dist.read_env()
    device = setup_process(env, device="cpu", threads=1, deterministic=False, timeout_s=120.0)
    start = time.perf_counter()
    manifest = verify(spec["data"])
    verify_s = time.perf_counter() - start
    seeds.seed_all(0)
    wl = workloads.load("gpt", spec["model"], input_shape=[], num_classes=manifest["num_classes"])
    strategy = "ddp" if env.world_size > 1 else "single"
    loop = build_loop(wl, device, strategy_name=strategy, precision="fp32", optim=Optim(name="adamw", lr=3e-3))
    rss_before_mb = rss_anon_mb()
    split = open_split(spec["data"], "train", manifest, seq_len=wl.seq_len)
    touched = _touch_every_sample(split, env)
    rss_touched_mb = rss_anon_mb()
    batch = spec["batch_size"]
    steps = len(split) // (batch * env.world_size)
    plan = RunPlan(
        world_size=env.world_size,
        per_rank_batch=batch,
        grad_accum_steps=1,
        global_batch=batch * env.world_size,
        steps_per_epoch=steps,
        total_steps=steps,
    )
    times = _loader_arms(spec, split, loop, plan, env)
    mine = {
        "verify_s": verify_s,
        "rss_anon_before_data_mb": rss_before_mb,
        "rss_anon_after_full_pass_mb": rss_touched_mb,
        "rss_anon_after_steps_mb": rss_anon_mb(),
        "samples_fetched": touched,
        "times": times,
    }
    ranks = dist.all_gather_object(mine)
    del loop  # the DDP reducer goes before the process group (or exit can deadlock)
    dist.shutdown()
    return {"ranks": ranks, "samples": len(split), "is_main": env.is_main}


def main(spec_path: str, out_path: str) -> None:
    result = measure(json.loads(Path(spec_path).read_text()))
    if result.pop("is_main"):
        atomic_write_json(out_path, result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
