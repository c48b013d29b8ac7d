"""Start-up and fixed costs of `scalelab train`: where the time before the first step and after
the last one goes.

    scalelab bench startup --out results/bench       # -> results/bench/startup.json

The method is METHOD below; the JSON file carries it.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from scalelab.bench import handwritten, harness, pipeline
from scalelab.bench.harness import Goal, opt
from scalelab.config import DataConfig, build, strategies
from scalelab.data.prepare import prepare
from scalelab.launch.local import worker_command
from scalelab.runtime.paths import repo_root
from scalelab.runtime.timings import ENV as TIMINGS_ENV

METHOD = """\
`scalelab train` runs `--repeats` times as a fresh process from the repository root, on the given
params (data prepared once, untimed), each into a fresh folder, with SCALELAB_TIMINGS set: the
launcher and every rank append a timestamp at each phase boundary (scalelab.runtime.timings.mark).
The MLflow store is a SQLite file whose schema is made before the first run. Phases (rank 0,
median over repeats, s): before the first step `python_and_cli`, `launcher_imports`,
`plan_and_torchrun_start`, `worker_imports`, `rendezvous`, `run_creation`, `monitor_start`,
`data_load`, `model_build`, `first_step`; after the last `outputs`, `monitor_stop`, `final_flush`,
`worker_exit_and_teardown`, `launcher_exit`. Fixed cost is wall time less the steps. An older
startup.json's figures from another commit move to `previous`. `vs_handwritten`: each repeat
pairs `scalelab train` with benchmarks/handwritten_ddp.py (the same job by hand), the order
alternating; ratios of wall time and of time to rank 0's first step, median over pairs with a
paired bootstrap 95% interval; goals 1.10 and 1.5. Busy pairs are retried or dropped (study.busy).
"""
OUT_FILE = "startup.json"
GOAL = Goal("<", 0.40, "< 40% of previous")  # fixed costs against the previous figures (issue 11)
BEFORE = [  # (phase, from mark, to mark); "start" is the process start, seen by this benchmark
    ("python_and_cli", "start", "launcher_cli"),
    ("launcher_imports", "launcher_cli", "launcher_imported"),
    ("plan_and_torchrun_start", "launcher_imported", "worker_cli"),
    ("worker_imports", "worker_cli", "worker_imported"),
    ("rendezvous", "worker_imported", "process_group"),
    ("run_creation", "process_group", "run_created"),
    ("monitor_start", "run_created", "monitor_started"),
    ("data_load", "monitor_started", "data_loaded"),
    ("model_build", "data_loaded", "model_built"),
    ("first_step", "model_built", "first_step"),
]
AFTER = [
    ("outputs", "last_step", "outputs_written"),
    ("monitor_stop", "outputs_written", "final_flush"),
    ("final_flush", "final_flush", "finished"),
    ("worker_exit_and_teardown", "finished", "launcher_done"),
    ("launcher_exit", "launcher_done", "end"),
]


def _params(args: Any, folder: Path) -> Path:
    params = yaml.safe_load(Path(args.params).read_text())
    if args.epochs:
        params["train"]["epochs"] = args.epochs
    if args.strategy:
        params["train"]["strategy"] = args.strategy
        if not strategies.get(args.strategy).parallel:
            params["train"]["nproc_per_node"] = 1
    params["tracking"]["experiment"] = "bench-startup"
    params["tracking"]["enabled"] = not args.no_tracking
    return pipeline.write_params(folder / "params.yaml", params)


def one_run(params: Path, data: Path, out: Path, env: dict[str, str]) -> dict[str, float]:
    """Runs `scalelab train` once; returns mark -> seconds since the process start (rank 0), and
    `steps_trained`."""
    marks_file = out.with_suffix(".jsonl")
    env = {**env, TIMINGS_ENV: str(marks_file)}
    start = time.time()
    proc = subprocess.run(
        worker_command(["train", "--params", str(params), "--data", str(data), "--out", str(out)]),
        cwd=repo_root(),
        env=env,
        capture_output=True,
        text=True,
    )
    end = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"scalelab train exited with {proc.returncode}: {proc.stderr[-2000:]}")
    marks = {"start": 0.0, "end": end - start}
    for line in marks_file.read_text().splitlines():
        row = json.loads(line)
        if row["rank"] == 0:  # the launcher (RANK unset) and rank 0; single: one process
            marks.setdefault(row["phase"], row["t"] - start)
    marks.setdefault("worker_cli", marks["launcher_imported"])  # single, dp: no worker process
    marks.setdefault("worker_imported", marks["worker_cli"])
    marks["steps_trained"] = json.loads((out / "metrics.json").read_text())["steps"]  # a count, not a time
    return marks


def phases(marks: dict[str, float]) -> dict[str, float]:
    """Phase -> seconds, from one run's marks."""
    out = {name: marks[b] - marks[a] for name, a, b in BEFORE + AFTER}
    out["to_first_step"] = marks["first_step"]
    out["after_last_step"] = marks["end"] - marks["last_step"]
    out["steps"] = marks["last_step"] - marks["first_step"]
    out["wall"] = marks["end"]
    out["fixed"] = out["wall"] - out["steps"]
    out["writer_start_ms"] = 1000.0 * (marks.get("writer_started", 0.0) - marks.get("writer_start", 0.0))
    return out


def measure_runs(ctx: harness.Context) -> tuple[list[dict], list[dict], str, Any]:
    """Prepares the data once, then takes `--repeats` pairs: `scalelab train` and the hand-written
    script where it applies, the order alternating (busy pairs retried or dropped); returns each
    train run's marks, each script run's figures, why there are none, and the Repeats."""
    args, work = ctx.args, ctx.work
    params = _params(args, work)
    tree = yaml.safe_load(params.read_text())
    env = pipeline.store_env(work, tracking=tree["tracking"]["enabled"])  # the schema made, untimed
    data = work / "prepared"
    prepare(build(DataConfig, tree["data"]), data)  # not timed
    script, reason = (None, "tracking is off")
    if tree["tracking"]["enabled"]:
        script, reason = handwritten.command(tree, work / "handwritten-train.pt")
    if script is not None:
        handwritten.training_split(tree, work / "handwritten-train.pt")  # not timed, as `prepare` is not
    script_env, threads = handwritten.environment(env), tree["train"]["threads_per_process"]
    arms = {
        "scalelab": lambda i: one_run(params, data, work / f"train-{i}", env),
        "handwritten": lambda i: handwritten.run_once(script, work, script_env, threads),
    }
    names = ["scalelab", "handwritten"] if script is not None else ["scalelab"]
    reps = harness.take_repeats(lambda i: {n: arms[n](i) for n in (names if i % 2 == 0 else names[::-1])}, ctx.policy())
    return [r["scalelab"] for r in reps.kept], [r["handwritten"] for r in reps.kept if script], reason, reps


def _git_commit() -> str:
    """HEAD, plus a digest of the uncommitted changes to libs/ when there are any."""
    git = ["git", "-C", str(repo_root())]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    diff = subprocess.run([*git, "diff", "HEAD", "--", "libs"], capture_output=True).stdout
    return f"{head}+dirty-{hashlib.sha256(diff).hexdigest()[:8]}" if diff else head


def summarize(runs: list[dict[str, float]], args: Any, previous: dict | None) -> dict[str, Any]:
    per_run = [phases(m) for m in runs]
    median = {k: statistics.median(p[k] for p in per_run) for k in per_run[0]}
    fixed = {name: median[name] for name, _, _ in BEFORE + AFTER}
    largest = max(fixed, key=fixed.get)
    ratio = median["fixed"] / previous["median_s"]["fixed"] if previous else None
    return {
        "params": {"file": args.params, "epochs": args.epochs or "as in params",
                   "strategy": args.strategy or "as in params", "tracking": not args.no_tracking},
        "repeats": args.repeats, "current": {"commit": _git_commit(), "median_s": median, "repeats_s": per_run},
        "largest_fixed_cost": {"phase": largest, "median_s": fixed[largest]},
        "fixed_fraction_of_wall": median["fixed"] / median["wall"], "raw_marks_s": runs, "previous": previous,
        "goal": f"fixed cost < {GOAL.target:.0%} of the previous figures", "fixed_vs_previous": ratio,
        "meets_goal": GOAL.met(ratio),
        **({"side_by_side_s": {k: [previous["median_s"].get(k), v] for k, v in median.items()}} if previous else {}),
    }  # fmt: skip


def _previous(out_dir: Path) -> dict | None:
    """The figures of an earlier commit: an older startup.json's current (or its previous)."""
    path = out_dir / OUT_FILE
    if not path.is_file():
        return None
    old = json.loads(path.read_text())
    return old.get("previous") if old["current"]["commit"] == _git_commit() else old["current"]


def measure(ctx: harness.Context) -> dict[str, Any]:
    """startup.json's figures and its summary lines."""
    runs, script_runs, reason, reps = measure_runs(ctx)
    result = {**summarize(runs, ctx.args, _previous(ctx.out)), **reps.json()}
    ours = [{"wall": m["end"], "first_step": m["first_step"], "steps": m["steps_trained"]} for m in runs]
    result["vs_handwritten"] = handwritten.compare(ours, script_runs) if script_runs else {"not_measured": reason}
    handwritten.figures(ctx, result["vs_handwritten"] if script_runs else None, reason, reps.dropped)
    med, prev, big = result["current"]["median_s"], result["previous"], result["largest_fixed_cost"]
    text = (
        f"fixed cost {med['fixed']:.2f} s of {med['wall']:.2f} s wall ({med['to_first_step']:.2f} s to the first "
        f"step, {med['after_last_step']:.2f} s after the last); largest {big['phase']} {big['median_s']:.2f} s"
        + (f"; {result['fixed_vs_previous']:.2f}x the previous {prev['median_s']['fixed']:.2f} s" if prev else "")
    )
    ctx.figure("startup_fixed_cost", text, result["fixed_vs_previous"], GOAL, dropped=reps.dropped)
    return result


BENCH = harness.Benchmark(
    "startup",
    "startup.json",
    METHOD,
    measure,
    options=(
        opt("--params", "params.yaml", "the params to train with"),
        opt("--repeats", 3, "timed runs of scalelab train, each paired with the hand-written script's"),
        opt("--epochs", 0, "override train.epochs (0: keep)"),
        opt("--strategy", "", "override train.strategy (empty: keep)"),
        opt("--no-tracking", False, "tracking.enabled: false (tests)"),
    ),
)
