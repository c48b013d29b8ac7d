"""What `StopFlag.everywhere` costs a DDP step: the one-element all-reduce SLURM jobs run every
`slurm.stop_check_every_steps` steps (10 by default; it was every step, +26% of a 4 ms step here).

Part of `scalelab bench tracking` (its `stop_flag` block). One rank by hand:

    torchrun --standalone --nproc-per-node 2 -m scalelab.bench.stopflag_cost SPEC.json OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from scalelab.bench import stats
from scalelab.runtime import dist, seeds
from scalelab.runtime.device import setup_process
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.signals import StopFlag
from scalelab.training import workloads
from scalelab.training.loop import Optim, build_loop

METHOD = """\
`--stop-procs` processes under torchrun (gloo, 1 torch thread each), strategy ddp, the train
stage's default model (params.yaml train.model, without dropout) on 64 features (digits), per-rank
batch `--stop-batch` (train.batch_size), synthetic batches in memory. Two arms interleaved in every
repeat, in alternating order: `plain` (Loop.step) and `stop_flag` (Loop.step, then
StopFlag.everywhere every `every` steps, as job.py runs it in SLURM jobs). A repeat's figure per arm is the median
step time of rank 0 over `--stop-steps` steps; the cost is the median over repeats of
stop_flag/plain with a bootstrap 95% interval (scalelab.bench.stats). `call_us` times the
everywhere call alone (perf_counter around it, every step of the stop_flag arm)."""
THRESHOLD_FRACTION = 0.01  # above this the check "shows"


def measure(
    *, procs: int, steps: int, repeats: int, batch: int, hidden: list[int], work: Path, every: int
) -> dict[str, Any]:
    """Runs the ranks under torchrun; returns the figures (rank 0's times, s)."""
    spec, out = work / "stop-spec.json", work / "stop-out.json"
    spec.write_text(json.dumps({"steps": steps, "repeats": repeats, "batch": batch, "hidden": hidden, "every": every}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"]
    proc = subprocess.run(
        [*cmd, "-m", "scalelab.bench.stopflag_cost", str(spec), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=max(300.0, 0.1 * steps * repeats),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"stop-flag ranks failed ({proc.returncode}): {proc.stderr[-2000:]}")
    raw = json.loads(out.read_text())
    med = {arm: [stats.median(rep) for rep in reps] for arm, reps in raw["times"].items()}
    ratio = stats.ratio_figures(med["stop_flag"], med["plain"])
    call_us = 1e6 * stats.median([x for rep in raw["call_s"] for x in rep])
    plain_ms = 1000.0 * stats.median(med["plain"])
    call_fraction = call_us / (1000.0 * plain_ms)
    shows = ratio["median_ratio"] - 1.0 > THRESHOLD_FRACTION or call_fraction > THRESHOLD_FRACTION
    return {
        "method": METHOD,
        "processes": procs,
        "check_every_steps": every,
        "steps_per_repeat": steps,
        "repeats": repeats,
        "batch_size_per_rank": batch,
        "hidden": hidden,
        "plain_step_ms_median": plain_ms,
        "call_us_median": call_us,
        "call_fraction_of_step": call_fraction,
        "ab_ratio": ratio,
        "cost_fraction_of_step": ratio["median_ratio"] - 1.0,
        "threshold_fraction": THRESHOLD_FRACTION,
        "shows": shows,
        "note": (
            f"checked every {every} steps, it still costs more than 1% of this step: raise "
            "slurm.stop_check_every_steps (each step more delays a preemption stop by one step)"
            if shows
            else f"checked every {every} steps (slurm.stop_check_every_steps): under 1% of the step"
        ),
        "raw_times_s": raw["times"],
    }


def _rank(spec: dict[str, Any], out: Path) -> None:
    """One rank: builds the loop, runs the interleaved arms, rank 0 writes the times."""
    env = dist.read_env()
    device = setup_process(env, device="cpu", threads=1, timeout_s=120.0)  # a hung peer fails the bench
    seeds.seed_all(0)
    wl = workloads.load("mlp", {"hidden": spec["hidden"], "dropout": 0.0}, input_shape=[64], num_classes=10)
    loop = build_loop(wl, device, strategy_name="ddp", precision="fp32", optim=Optim(name="adamw", lr=1e-3))
    batches = [(torch.randn(spec["batch"], 64), torch.randint(10, (spec["batch"],))) for _ in range(2)]
    flag = StopFlag()
    times: dict[str, list[list[float]]] = {"plain": [], "stop_flag": []}
    call_s: list[list[float]] = []
    for step in range(20):  # warm-up
        loop.step([batches[step % 2]])
    for rep in range(spec["repeats"]):
        for arm in ("plain", "stop_flag") if rep % 2 == 0 else ("stop_flag", "plain"):
            rep_times, calls = [], []
            dist.barrier()
            for step in range(spec["steps"]):
                start = time.perf_counter()
                loop.step([batches[step % 2]])
                if arm == "stop_flag" and (step + 1) % spec["every"] == 0:
                    call = time.perf_counter()
                    flag.everywhere(device)
                    calls.append(time.perf_counter() - call)
                rep_times.append(time.perf_counter() - start)
            times[arm].append(rep_times)
            if calls:
                call_s.append(calls)
    dist.all_gather_object(None)  # every rank is past its last collective; exit without teardown
    if env.is_main:
        atomic_write_json(out, {"times": times, "call_s": call_s})


if __name__ == "__main__":
    _rank(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
