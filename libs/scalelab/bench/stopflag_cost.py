"""What `StopFlag.everywhere` costs a DDP step: the one-element all-reduce SLURM jobs run every
`slurm.stop_check_every_steps` steps (10 by default; it was every step, +26% of a 4 ms step here).

Part of `scalelab bench tracking` (its `stop_flag` block). The ranks run through
launch.local.run_ranks; one by hand, with a spec.json that `measure` wrote:

    torchrun --standalone --nproc-per-node 2 -m scalelab.cli bench-worker stopflag --spec SPEC.json --out OUT.json
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from scalelab.bench import stats
from scalelab.launch.local import LaunchError, run_ranks
from scalelab.runtime import dist, seeds
from scalelab.runtime.device import setup_process
from scalelab.runtime.repeats import timed_repeats
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
    spec = {"steps": steps, "repeats": repeats, "batch": batch, "hidden": hidden, "every": every}
    try:  # a hung peer fails the ranks' collectives (their timeout), and so the benchmark
        raw = run_ranks(["bench-worker", "stopflag"], spec, work, "stop", nproc=procs, threads_per_process=1)
    except LaunchError as exc:
        raise LaunchError(f"stop-flag ranks: {exc}") from exc
    med = {arm: [stats.median(rep) for rep in reps] for arm, reps in raw["times"].items()}
    ratio = stats.ratio_figures(med["stop_flag"], med["plain"])
    call_us = 1e6 * stats.median(raw["call_s"])
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


def measure_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank: builds the loop, runs the interleaved arms; returns this rank's step times and
    the StopFlag calls' times (rank 0's are the figures)."""
    env = dist.read_env()
    device = setup_process(env, device="cpu", threads=1, timeout_s=120.0)  # a hung peer fails the bench
    seeds.seed_all(0)
    wl = workloads.load("mlp", {"hidden": spec["hidden"], "dropout": 0.0}, input_shape=[64], num_classes=10)
    loop = build_loop(wl, device, strategy_name="ddp", precision="fp32", optim=Optim(name="adamw", lr=1e-3))
    batches = [(torch.randn(spec["batch"], 64), torch.randint(10, (spec["batch"],))) for _ in range(2)]
    flag, call_s = StopFlag(), []

    def stop_flag(step: int) -> None:  # Loop.step, then the check every `every` steps, as job.py runs it
        loop.step([batches[step % 2]])
        if (step + 1) % spec["every"] == 0:
            call = time.perf_counter()
            flag.everywhere(device)
            call_s.append(time.perf_counter() - call)

    for step in range(20):  # warm-up
        loop.step([batches[step % 2]])
    arms = {"plain": lambda step: loop.step([batches[step % 2]]), "stop_flag": stop_flag}
    times = timed_repeats(arms, repeats=spec["repeats"], steps=spec["steps"])
    dist.all_gather_object(None)  # every rank is past its last collective; exit without teardown
    return {"times": times, "call_s": call_s, "is_main": env.is_main}
