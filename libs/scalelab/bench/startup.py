"""Start-up and fixed costs of `scalelab train` (where the time before the first step and after the
last goes), and the same job by hand: `benchmarks/handwritten_ddp.py` under torchrun, in
interleaved pairs; defined for the default job only (mlp, ddp, digits), else "not measured"."""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from scalelab.bench import harness, pipeline, stats
from scalelab.bench.harness import Goal, opt
from scalelab.config import strategies
from scalelab.data.store import open_split, read_manifest
from scalelab.runtime.paths import PACKAGE_ROOT, repo_root
from scalelab.runtime.timings import ENV as TIMINGS_ENV

METHOD = """\
`scalelab train` runs `--repeats` times, a fresh process from the repository root each into a fresh folder (data
prepared once, untimed), with SCALELAB_TIMINGS set: the launcher and every rank append a timestamp at each phase
boundary (runtime.timings.mark); the SQLite MLflow store's schema is made before the first run. Phases (rank 0,
median over repeats, s): from one mark to the next (BEFORE and AFTER in bench/startup.py). Fixed cost: wall time
less the steps; an older startup.json's figures from another commit move to `previous`. `vs_handwritten`: each
repeat pairs it with benchmarks/handwritten_ddp.py, the order alternating: ratios of wall time and of time to rank
0's first step, median over pairs with a paired bootstrap 95% interval. Busy pairs retried or dropped (study.busy).
"""
OUT_FILE = "startup.json"
GOAL = Goal("<", 0.40, "< 40% of previous")  # fixed costs against the previous figures (issue 11)
# each phase runs from its mark to the next (rank 0's marks; "start": the process start, seen here)
MARKS_BEFORE = ["start", "launcher_cli", "launcher_imported", "worker_cli", "worker_imported", "process_group"]
MARKS_BEFORE += ["run_created", "monitor_started", "data_loaded", "model_built", "first_step"]
PHASES = ["python_and_cli", "launcher_imports", "plan_and_torchrun_start", "worker_imports", "rendezvous"]
PHASES += ["run_creation", "monitor_start", "data_load", "model_build", "first_step"]
BEFORE = list(zip(PHASES, MARKS_BEFORE, MARKS_BEFORE[1:]))  # (phase, from mark, to mark)
MARKS_AFTER = ["last_step", "outputs_written", "final_flush", "finished", "launcher_done", "end"]
PHASES = ["outputs", "monitor_stop", "final_flush", "worker_exit_and_teardown", "launcher_exit"]
AFTER = list(zip(PHASES, MARKS_AFTER, MARKS_AFTER[1:]))
SCRIPT = PACKAGE_ROOT / "benchmarks" / "handwritten_ddp.py"
GOALS = {"wall": Goal("<=", 1.10, "<= 1.10"), "first_step": Goal("<=", 1.5, "<= 1.50")}  # scalelab / by hand


def _params(args: Any, folder: Path) -> tuple[Path, dict[str, Any]]:
    """The params file to train with (`args`' overrides applied) and its tree."""
    params = yaml.safe_load(Path(args.params).read_text())
    if args.epochs:
        params["train"]["epochs"] = args.epochs
    if args.strategy:
        params["train"]["strategy"] = args.strategy
        if not strategies.get(args.strategy).parallel:
            params["train"]["nproc_per_node"] = 1
    params["tracking"] |= {"experiment": "bench-startup", "enabled": not args.no_tracking}
    return pipeline.write_params(folder / "params.yaml", params), params


def one_run(params: Path, data: Path, out: Path, env: dict[str, str]) -> dict[str, float]:
    """One `scalelab train`: mark -> seconds since the process start (rank 0), and `steps_trained`."""
    marks_file, start = out.with_suffix(".jsonl"), time.time()
    args = ["train", "--params", str(params), "--data", str(data), "--out", str(out)]
    pipeline.scalelab(*args, cwd=repo_root(), env={**env, TIMINGS_ENV: str(marks_file)})
    marks = {"start": 0.0, "end": time.time() - start}
    for row in map(json.loads, marks_file.read_text().splitlines()):
        if row["rank"] == 0:  # the launcher (RANK unset) and rank 0; single: one process
            marks.setdefault(row["phase"], row["t"] - start)
    marks.setdefault("worker_cli", marks["launcher_imported"])  # single, dp: no worker process
    marks.setdefault("worker_imported", marks["worker_cli"])
    marks["steps_trained"] = json.loads((out / "metrics.json").read_text())["steps"]  # a count, not a time
    return marks


def phases(marks: dict[str, float]) -> dict[str, float]:
    """Phase -> seconds, from one run's marks."""
    steps = marks["last_step"] - marks["first_step"]
    out = {name: marks[b] - marks[a] for name, a, b in BEFORE + AFTER}
    out |= {"to_first_step": marks["first_step"], "after_last_step": marks["end"] - marks["last_step"], "steps": steps}
    out |= {"wall": marks["end"], "fixed": marks["end"] - steps}
    out["writer_start_ms"] = 1000.0 * (marks.get("writer_started", 0.0) - marks.get("writer_start", 0.0))
    return out


def measure_runs(ctx: harness.Context) -> tuple[list[dict], list[dict], str, Any]:
    """Pairs of `scalelab train` and the script (where it applies), the order alternating: each
    train run's marks, each script run's figures, why there are none, and the Repeats."""
    work = ctx.work
    params, tree = _params(ctx.args, work)
    env = pipeline.store_env(work, tracking=tree["tracking"]["enabled"])  # the schema made, untimed
    data, split = pipeline.prepare_data(tree, work / "prepared"), work / "handwritten-train.pt"  # not timed
    script, reason = command(tree, split) if tree["tracking"]["enabled"] else (None, "tracking is off")
    arms = {"scalelab": lambda i: one_run(params, data, work / f"train-{i}", env)}
    if script is not None:  # the script's data: `prepare`'s training split (features flattened), not timed either
        arrays = open_split(data, "train", read_manifest(data)).arrays
        torch.save({"x": torch.tensor(arrays["x"]).flatten(1), "y": torch.tensor(arrays["y"])}, split)
        script_env = {k: v for k, v in env.items() if k != TIMINGS_ENV} | {"PYTHONUNBUFFERED": "1"}
        arms["handwritten"] = lambda i: run_once(script, work, script_env, tree["train"]["threads_per_process"])
    reps = harness.take_repeats(lambda i: {n: arms[n](i) for n in harness.rotated(arms, i)}, ctx.policy())
    return [r["scalelab"] for r in reps.kept], [r["handwritten"] for r in reps.kept if script], reason, reps


def _git_commit() -> str:
    """HEAD, plus a digest of the uncommitted changes to libs/ when there are any."""
    git = ["git", "-C", str(repo_root())]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    diff = subprocess.run([*git, "diff", "HEAD", "--", "libs"], capture_output=True).stdout
    return f"{head}+dirty-{hashlib.sha256(diff).hexdigest()[:8]}" if diff else head


def _previous(out_dir: Path) -> dict | None:
    """The figures of an earlier commit: an older startup.json's current (or its previous)."""
    path = out_dir / OUT_FILE
    if not path.is_file():
        return None
    old = json.loads(path.read_text())
    return old.get("previous") if old["current"]["commit"] == _git_commit() else old["current"]


def measure(ctx: harness.Context) -> dict[str, Any]:
    args, (runs, script_runs, reason, reps) = ctx.args, measure_runs(ctx)
    ours = [{"wall": m["end"], "first_step": m["first_step"], "steps": m["steps_trained"]} for m in runs]
    versus = compare(ours, script_runs) if script_runs else {"not_measured": reason}
    for figure, goal in GOALS.items():
        name, fig = f"startup_vs_handwritten_{figure}", versus.get(figure)
        if fig is None:
            ctx.figure(name, f"not measured: {reason}", None, goal)
            continue
        pairs = f"; medians {stats.median(fig['scalelab_s']):.2f} s vs {stats.median(fig['handwritten_s']):.2f} s"
        text = f"scalelab train / hand-written torchrun script {figure.replace('_', ' ')} "
        text += stats.ratio_text(fig, inner=f"{pairs} over {len(fig['scalelab_s'])} interleaved pairs")
        ctx.figure(name, text, fig["median_ratio"], goal, dropped=reps.dropped)
    per_run, previous = [phases(m) for m in runs], _previous(ctx.out)
    med = {k: statistics.median(p[k] for p in per_run) for k in per_run[0]}
    big = max((name for name, _, _ in BEFORE + AFTER), key=med.get)  # the largest fixed cost
    ratio = med["fixed"] / previous["median_s"]["fixed"] if previous else None
    text = f"fixed cost {med['fixed']:.2f} s of {med['wall']:.2f} s wall ({med['to_first_step']:.2f} s to the first "
    text += f"step, {med['after_last_step']:.2f} s after the last); largest {big} {med[big]:.2f} s"
    if previous:
        text += f"; {ratio:.2f}x the previous {previous['median_s']['fixed']:.2f} s"
    ctx.figure("startup_fixed_cost", text, ratio, GOAL, dropped=reps.dropped)
    return {
        "params": {"file": args.params, "epochs": args.epochs or "as in params",
                   "strategy": args.strategy or "as in params", "tracking": not args.no_tracking},
        "repeats": args.repeats, "current": {"commit": _git_commit(), "median_s": med, "repeats_s": per_run},
        "largest_fixed_cost": {"phase": big, "median_s": med[big]}, "previous": previous,
        "fixed_fraction_of_wall": med["fixed"] / med["wall"], "raw_marks_s": runs, "fixed_vs_previous": ratio,
        "vs_handwritten": versus, **reps.json(),
    }  # fmt: skip


def command(params: dict[str, Any], split: Path) -> tuple[list[str] | None, str]:
    """The torchrun command for the params' train section, or (None, why it does not apply)."""
    train = params["train"]
    wanted = {"workload": "mlp", "launcher": "local", "grad_accum_steps": 1, "num_nodes": 1, "optimizer": "adamw"}
    off = {k: train.get(k) for k, v in {**wanted, "precision": "fp32"}.items() if train.get(k, v) != v}
    kind = strategies.get(train.get("strategy", "ddp"))
    if not kind.distributed or kind.sharded:  # the script wraps the model in DDP
        off["strategy"] = train.get("strategy")
    if params["data"].get("source", "digits") != "digits":
        off["data.source"] = params["data"]["source"]
    if off:
        return None, f"the hand-written script is the default job (mlp, ddp, digits, adamw, fp32); these differ: {off}"
    model = train.get("model", {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={train['nproc_per_node']}"]
    cmd += [str(SCRIPT), f"--data={split}", f"--epochs={train['epochs']}", f"--batch-size={train['batch_size']}"]
    cmd += [f"--lr={train['lr']}", f"--dropout={model.get('dropout', 0.1)}", "--hidden"]
    return cmd + [str(h) for h in model.get("hidden", [256, 256])], ""  # plain torchrun, as its user types it


def run_once(cmd: list[str], cwd: Path, env: dict[str, str], threads: int) -> dict[str, float]:
    """One run of the script: wall time and time to its first step, in seconds from the start."""
    start = time.time()
    proc = pipeline.run(cmd, "the hand-written script", cwd=cwd, env={**env, "OMP_NUM_THREADS": str(threads)})
    end = time.time()
    said = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("first_step_at", "steps")))
    return {"wall": end - start, "first_step": float(said["first_step_at"]) - start, "steps": int(said["steps"])}


def compare(ours: list[dict[str, float]], handwritten: list[dict[str, float]]) -> dict[str, Any]:
    """scalelab / hand-written for each figure, paired by repeat (RuntimeError: not the same steps)."""
    steps = {int(r["steps"]) for r in ours + handwritten}
    if len(steps) != 1:
        raise RuntimeError(f"scalelab train and the hand-written script ran {sorted(steps)} steps: not the same job")
    out: dict[str, Any] = {"script": str(SCRIPT.relative_to(PACKAGE_ROOT)), "steps": steps.pop()}
    for figure in GOALS:
        mine, theirs = [o[figure] for o in ours], [h[figure] for h in handwritten]
        out[figure] = {**stats.ratio_figures(mine, theirs), "scalelab_s": mine, "handwritten_s": theirs}
    return out


OPTIONS = (
    opt("--params", "params.yaml", "the params to train with"),
    opt("--repeats", 3, "timed runs of scalelab train, each paired with the hand-written script's"),
    opt("--epochs", 0, "override train.epochs (0: keep)"),
    opt("--strategy", "", "override train.strategy (empty: keep)"),
    opt("--no-tracking", False, "tracking.enabled: false (tests)"),
)
BENCH = harness.Benchmark("startup", OUT_FILE, METHOD, measure, OPTIONS)
