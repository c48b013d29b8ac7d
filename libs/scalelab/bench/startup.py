"""Start-up and fixed costs of `scalelab train`: where the time before the first step and after
the last one goes.

    scalelab bench startup --out results/bench       # -> results/bench/startup.json

The method is METHOD below; the JSON file carries it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from scalelab.bench import handwritten, pipeline, stats
from scalelab.config import DataConfig, build, strategies
from scalelab.data.prepare import prepare
from scalelab.launch.local import worker_command
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.paths import repo_root
from scalelab.runtime.timings import ENV as TIMINGS_ENV

METHOD = """\
`scalelab train` runs `--repeats` times as a fresh process from the repository root, on the given
params (default params.yaml, its data section prepared once before, untimed), each
into a fresh output folder, with SCALELAB_TIMINGS set: the launcher and every rank append a
timestamp at each phase boundary (scalelab.runtime.timings.mark, in cli/train.py,
cli/train_worker.py, training/job.py and tracking/writer.py). The MLflow store is a SQLite file in
a temporary folder, created (schema migrated) before the first timed run, as a store in use is.
Phases (rank 0, median over repeats, s): before the first step, `python_and_cli` (process start
to scalelab.cli loaded), `launcher_imports`, `plan_and_torchrun_start` (validation, run plan,
resolved.json, torchrun and the worker's Python), `worker_imports`, `rendezvous` (torchrun's
rendezvous and init_process_group), `run_creation` (the MLflow run with params, provenance tags
and artifacts; mlflow is imported here), `monitor_start`, `data_load`, `model_build`,
`first_step`; after the last step, `outputs` (model, metrics, artifacts), `monitor_stop`,
`final_flush` (tracker.finish: drain the writer, end the run), `worker_exit_and_teardown`
(interpreter exit of the ranks and torchrun's shutdown) and `launcher_exit`. `writer_start_ms`
is what starting the metric writer costs the training thread (inside the steps). Fixed cost is
wall time minus the steps (first step to last step). When the output folder already holds a
startup.json from another commit, its figures move to `previous` for a side-by-side comparison.
`vs_handwritten`: each repeat is a pair, `scalelab train` and benchmarks/handwritten_ddp.py (the
same job written by hand: torchrun, DistributedSampler, the MLP, AdamW, rank-0 MLflow logging of
the params and of the loss every 10 steps), run one after the other in an order that alternates
from pair to pair, on the same prepared-data size, threads and MLflow store. Ratios scalelab /
hand-written of the end-to-end wall time and of the time to rank 0's first step (from the process
start), median over pairs with a paired bootstrap 95% interval; goals 1.10 and 1.5.
"""
OUT_FILE = "startup.json"
GOAL_FRACTION = 0.40  # fixed costs < 40% of the previous figures (issue 11)
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml", help="the params to train with")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs of scalelab train, each paired with the hand-written script's (default: 3)",
    )
    parser.add_argument("--epochs", type=int, default=0, help="override train.epochs (0: keep)")
    parser.add_argument("--strategy", default="", help="override train.strategy (empty: keep)")
    parser.add_argument("--no-tracking", action="store_true", help="tracking.enabled: false (tests)")


def _params(args: argparse.Namespace, folder: Path) -> Path:
    params = yaml.safe_load(Path(args.params).read_text())
    if args.epochs:
        params["train"]["epochs"] = args.epochs
    if args.strategy:
        params["train"]["strategy"] = args.strategy
        params["train"]["nproc_per_node"] = (
            params["train"]["nproc_per_node"] if strategies.get(args.strategy).parallel else 1
        )
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


def measure(args: argparse.Namespace, work: Path) -> tuple[list[dict[str, float]], list[dict[str, float]], str]:
    """Prepares the data once, then times `--repeats` runs of `scalelab train`, each paired with
    a run of the hand-written script (the order alternates: train first in even pairs) where it
    applies; returns each train run's marks, each script run's figures, and why there are none."""
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
    ours, theirs = [], []
    script_env, threads = handwritten.environment(env), tree["train"]["threads_per_process"]
    arms = {
        "scalelab": lambda i: ours.append(one_run(params, data, work / f"train-{i}", env)),
        "handwritten": lambda i: theirs.append(handwritten.run_once(script, work, script_env, threads)),
    }
    names = ["scalelab", "handwritten"] if script is not None else ["scalelab"]
    for i in range(args.repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            arms[name](i)
    return ours, theirs, reason


def _git_commit() -> str:
    """HEAD, plus a digest of the uncommitted changes to libs/ when there are any."""
    git = ["git", "-C", str(repo_root())]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    diff = subprocess.run([*git, "diff", "HEAD", "--", "libs"], capture_output=True).stdout
    return f"{head}+dirty-{hashlib.sha256(diff).hexdigest()[:8]}" if diff else head


def summarize(runs: list[dict[str, float]], args: argparse.Namespace, previous: dict | None) -> dict[str, Any]:
    per_run = [phases(m) for m in runs]
    median = {k: statistics.median(p[k] for p in per_run) for k in per_run[0]}
    fixed = {name: median[name] for name, _, _ in BEFORE + AFTER}
    largest = max(fixed, key=fixed.get)
    current = {"commit": _git_commit(), "median_s": median, "repeats_s": per_run}
    result: dict[str, Any] = {
        "benchmark": "startup",
        "method": METHOD.strip(),
        "params": {
            "file": args.params,
            "epochs": args.epochs or "as in params",
            "strategy": args.strategy or "as in params",
            "tracking": not args.no_tracking,
        },
        "repeats": args.repeats,
        "current": current,
        "largest_fixed_cost": {"phase": largest, "median_s": fixed[largest]},
        "fixed_fraction_of_wall": median["fixed"] / median["wall"],
        "raw_marks_s": runs,
        "previous": previous,
        "goal": f"fixed cost < {GOAL_FRACTION:.0%} of the previous figures",
    }
    if previous:
        ratio = median["fixed"] / previous["median_s"]["fixed"]
        result["fixed_vs_previous"] = ratio
        result["meets_goal"] = ratio < GOAL_FRACTION
        result["side_by_side_s"] = {k: [previous["median_s"].get(k), v] for k, v in median.items()}
    else:
        result["fixed_vs_previous"] = None
        result["meets_goal"] = None
    return result


def _previous(out_dir: Path) -> dict | None:
    """The figures of an earlier commit: an older startup.json's current (or its previous)."""
    path = out_dir / OUT_FILE
    if not path.is_file():
        return None
    old = json.loads(path.read_text())
    return old.get("previous") if old["current"]["commit"] == _git_commit() else old["current"]


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Measures, writes `<out_dir>/startup.json` and a summary line; returns the JSON content."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bench-startup-", dir=out_dir))
    try:
        runs, script_runs, reason = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = summarize(runs, args, _previous(out_dir))
    ours = [{"wall": m["end"], "first_step": m["first_step"], "steps": m["steps_trained"]} for m in runs]
    result["vs_handwritten"] = handwritten.compare(ours, script_runs) if script_runs else {"not_measured": reason}
    handwritten.summary_lines(out_dir, result["vs_handwritten"] if script_runs else None, reason)
    atomic_write_json(out_dir / OUT_FILE, result)
    med = result["current"]["median_s"]
    prev = result["previous"]
    figure = (
        f"fixed cost {med['fixed']:.2f} s of {med['wall']:.2f} s wall ({med['to_first_step']:.2f} s to the first "
        f"step, {med['after_last_step']:.2f} s after the last); largest {result['largest_fixed_cost']['phase']} "
        f"{result['largest_fixed_cost']['median_s']:.2f} s"
        + (f"; {result['fixed_vs_previous']:.2f}x the previous {prev['median_s']['fixed']:.2f} s" if prev else "")
    )
    stats.write_summary_line(
        out_dir, "startup_fixed_cost", figure, f"< {GOAL_FRACTION:.0%} of previous", result["meets_goal"]
    )
    return result


def headline(result: dict, out: Path) -> str:
    """One line with the figures and their units."""
    med = result["current"]["median_s"]
    versus = result["vs_handwritten"]
    ratios = (
        f"; vs the hand-written script: wall {versus['wall']['median_ratio']:.2f}x, first step "
        f"{versus['first_step']['median_ratio']:.2f}x"
        if "wall" in versus
        else ""
    )
    return (
        f"startup: {med['to_first_step']:.2f} s to the first step, {med['after_last_step']:.2f} s after the last, "
        f"fixed {med['fixed']:.2f} s of {med['wall']:.2f} s; largest {result['largest_fixed_cost']['phase']}"
        f"{ratios} -> {out / OUT_FILE}"
    )
