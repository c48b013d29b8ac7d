"""Cached and incremental `dvc repro`: the no-op time, and the time after one evaluate param change."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from scalelab.bench import harness, pipeline, stats
from scalelab.bench.harness import Goal, opt
from scalelab.config import flatten, read_yaml
from scalelab.config.overrides import parse_overrides
from scalelab.runtime.paths import PACKAGE_ROOT

METHOD = """\
A temporary copy of the repository's files (tracked and untracked, not ignored), committed into a fresh git
repository with its own SQLite MLflow store, params.yaml shrunk by `--set` (default: 2 epochs, a one-cell study;
every stage, dep and out stays). After a first full repro (untimed), `no-op`: `--repeats` runs of `dvc repro` with
nothing changed (busy ones retried or dropped), wall time from process start to exit (`first_noop_s`: the first
alone, DVC may still fill its hash cache). `incremental`: `--incremental-repeats` times, `--param` is set to a value
it never had (half, half minus 1, ...: an old one would come from DVC's run cache) and `dvc repro` runs; its wall
time and the stages run (DVC's "Running stage" lines; goal: exactly `--stage`, besides `--guard`).
"""
NOOP = Goal("<=", 2.0, "<= 2 s, nothing rerun")
DEFAULT_SETS = ["train.epochs=2", "speedup.strategies=[single]", "speedup.world_sizes=[1]", "speedup.batch_sizes=[256]"]
DEFAULT_SETS += ["speedup.warmup_steps=1", "speedup.timed_steps=1", "speedup.repeats=1"]
RUNNING = re.compile(r"Running stage '([^']+)'")


def repro(dest: Path) -> dict[str, Any]:
    """`dvc repro` in the copy (this venv's tools first on PATH, the copy's own store): wall seconds, stages run."""
    bin_dir = str(Path(sys.executable).parent)
    env = pipeline.store_env(dest, tracking=False) | {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    start = time.perf_counter()
    proc = pipeline.run([f"{bin_dir}/dvc", "repro"], f"dvc repro in {dest}", cwd=dest, env=env)
    return {"wall_s": time.perf_counter() - start, "stages": RUNNING.findall(proc.stdout + proc.stderr)}


def measure(ctx: harness.Context) -> dict[str, Any]:
    args, dest = ctx.args, ctx.work / "repo"
    sets = DEFAULT_SETS if args.sets is None else args.sets
    pipeline.committed_copy(Path(args.repo), dest, {k: v[0] for k, v in parse_overrides(sets).items()})
    first = repro(dest)  # the whole pipeline, not timed
    reps = harness.take_repeats(lambda i: repro(dest), ctx.policy())
    base = flatten(read_yaml(dest / "params.yaml"))[args.param]
    noop, incremental = reps.kept, []
    for i in range(args.incremental_repeats):
        value = max(1, base // 2 - i)  # a new value each time: DVC's run cache restores an old one
        pipeline.edit_params(dest, {args.param: value})
        incremental.append({**repro(dest), "value": value})
    noop_s, inc_s = [r["wall_s"] for r in noop], [r["wall_s"] for r in incremental]
    nothing_ran = all(not r["stages"] for r in noop)
    only = all([s for s in r["stages"] if s != args.guard] == [args.stage] for r in incremental)
    result = {
        "overrides": sets, "first_repro": first, "noop_median_s": stats.median(noop_s), "noop_max_s": max(noop_s),
        "first_noop_s": noop_s[0], "noop_ran_nothing": nothing_ran, "noop": noop, "incremental_param": args.param,
        "incremental_stage": args.stage, "incremental_median_s": stats.median(inc_s), "incremental": incremental,
        "incremental_only_stage": only, **reps.json(),
    }  # fmt: skip
    text = f"no-op dvc repro {result['noop_median_s']:.2f} s median (max {result['noop_max_s']:.2f} s)"
    ctx.figure("dvc_noop", text, result["noop_median_s"], NOOP, also=nothing_ran, dropped=reps.dropped)
    ran = ", ".join(sorted({s for r in incremental for s in r["stages"]})) or "none"
    text = f"dvc repro after one {args.param} change {result['incremental_median_s']:.2f} s median, stages run: {ran}"
    ctx.figure("dvc_incremental", text, only, Goal("is", True, f"reruns only {args.stage} (and {args.guard})"))
    return result


OPTIONS = (
    opt("--repo", str(PACKAGE_ROOT), "the repository to copy"),
    opt("--repeats", 5, "no-op repros"),
    opt("--incremental-repeats", 2, "repros after a change of --param"),
    opt("--param", "evaluate.batch_size", "the int param to change"),
    opt("--stage", "evaluate", "the one stage that --param should rerun"),
    opt("--guard", "validate", "the params check every params edit reruns by design (dvc.yaml): not counted"),
    ("--set", {**pipeline.SET_OPTION[1], "default": None, "help": f"default: {DEFAULT_SETS}"}),
)
BENCH = harness.Benchmark("dvc", "dvc.json", METHOD, measure, OPTIONS, scratch_outside=True)  # outside any checkout
