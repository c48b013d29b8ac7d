"""Search methods on one budget: TPE with median pruning, random and grid, best objective and compute."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from scalelab.bench import harness, stats
from scalelab.bench.harness import Goal, opt
from scalelab.runtime.paths import PACKAGE_ROOT

METHOD = """\
Each arm is one `scalelab sweep submit` on this machine (`sweep.launcher: local`, `--parallel`
workers, journal storage) in its own temporary folder and MLflow store, on params.yaml shrunk to a
tiny digits MLP (sgd, `--epochs` epochs, one validation per epoch, one process). Objective
val_loss:min over the learning rate (log, 1e-4 to 1) and the hidden width (16 or 64). Arms: `tpe`
with `--pruner median`, `random` without pruning, `grid` over 6 log-spaced rates x 2 widths; the
same budget of `--trials` trials (the grid's size). Per arm: the best val_loss any trial reached,
the compute spent (training steps the trials ran, pruned ones up to their stop), trial states and
wall time. `--repeats` repeats every arm with another train.seed.
"""
OUT_FILE = "search.json"
GRID_LRS = [1e-4, 6.3e-4, 4e-3, 0.025, 0.16, 1.0]
SPACE = {"train.lr": "loguniform(1e-4,1.0)", "train.model.hidden": "choice([16],[64])"}
GOAL = Goal("<=", 1.0, "tpe with median pruning reaches a val_loss <= random's with fewer steps")
ARMS = {  # name -> (method, pruner, space)
    "tpe_median": ("tpe", "median", SPACE),
    "random": ("random", "none", SPACE),
    "grid": ("grid", "none", {"train.lr": ",".join(map(str, GRID_LRS)), "train.model.hidden": "[16],[64]"}),
}


def _params(repo: Path, epochs: int, seed: int) -> dict[str, Any]:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"].update(
        strategy="single", nproc_per_node=1, optimizer="sgd", epochs=epochs, batch_size=32, seed=seed,
        checkpoint_every_steps=1000, log_every_steps=20, untimed_steps=2, model={"hidden": [16], "dropout": 0.0},
    )  # fmt: skip
    params["tracking"]["system_metrics_interval_s"] = 0
    params["sweep"] = {**params.get("sweep", {}), "launcher": "local", "evaluate": False}
    return params


def run_arm(work: Path, name: str, args: Any, seed: int, data: Path) -> dict[str, Any]:
    method, pruner, space = ARMS[name]
    folder = work / f"{name}-{seed}"
    folder.mkdir(parents=True)
    (folder / "dvc.yaml").write_text("stages: {}\n")
    (folder / "params.yaml").write_text(yaml.safe_dump(_params(Path(args.repo), args.epochs, seed)))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "submit", "--name", "b", "--data", str(data)]
    cmd += ["--method", method, "--pruner", pruner, "--trials", str(args.trials), "--parallel", str(args.parallel)]
    cmd += [arg for key, text in space.items() for arg in ("-S", f"{key}={text}")]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: sweep exited {proc.returncode}: {(proc.stdout + proc.stderr)[-800:]}")
    import pandas as pd

    rows = pd.read_csv(folder / "results/sweeps/b/summary.csv")
    finished = rows.value[rows.state == "finished"]  # a pruned trial's value is where it stopped, not a result
    values = [v for v in finished if isinstance(v, float) and math.isfinite(v)]
    best = min(values) if values else None
    run = {"arm": name, "seed": seed, "best_val_loss": best, "compute_steps": int(rows.steps.fillna(0).sum())}
    return run | {"trials": len(rows), "states": rows.state.value_counts().to_dict(), "wall_s": wall_s}


def measure(ctx: harness.Context) -> dict[str, Any]:
    from scalelab.config import DataConfig, build
    from scalelab.data.prepare import prepare

    args, data = ctx.args, ctx.work / "data"
    prepare(build(DataConfig, {}), data)
    runs = [run_arm(ctx.work, name, args, seed, data) for seed in range(args.repeats) for name in ARMS]
    arms = {}
    for name in ARMS:
        mine = [r for r in runs if r["arm"] == name]
        best = [r["best_val_loss"] for r in mine if r["best_val_loss"] is not None]
        arms[name] = {
            "best_val_loss_median": stats.median(best) if best else None,
            "compute_steps_median": stats.median([r["compute_steps"] for r in mine]),
            "wall_s_median": stats.median([r["wall_s"] for r in mine]),
        }
    tpe, rnd = arms["tpe_median"], arms["random"]
    measured = tpe["best_val_loss_median"] is not None and rnd["best_val_loss_median"] is not None
    # TPE's loss over random's (goal <= 1), and only with fewer steps
    ratio = tpe["best_val_loss_median"] / rnd["best_val_loss_median"] if measured else None
    fewer = tpe["compute_steps_median"] < rnd["compute_steps_median"]
    best = {n: a["best_val_loss_median"] for n, a in arms.items()}
    loss = {n: "none" if b is None else f"{b:.4f}" for n, b in best.items()}
    figure = "; ".join(f"{n} best val_loss {loss[n]} in {a['compute_steps_median']:.0f} steps" for n, a in arms.items())
    ctx.figure("search", figure, ratio, GOAL, also=fewer)
    return {
        "trials": args.trials, "parallel": args.parallel, "epochs": args.epochs, "repeats": args.repeats,
        "arms": arms, "runs": runs, "goal": str(GOAL), "meets_goal": GOAL.met(ratio, also=fewer),
    }  # fmt: skip


OPTIONS = (
    opt("--repo", str(PACKAGE_ROOT), "the repository whose params.yaml is shrunk"),
    opt("--trials", len(GRID_LRS) * 2, "the budget of every arm"),
    opt("--parallel", 2, "local workers of every arm"),
    opt("--epochs", 4, "train.epochs of every trial"),
    opt("--repeats", 1, "seeds per arm"),
)
BENCH = harness.Benchmark("search", "search.json", METHOD, measure, OPTIONS, scratch_outside=True)
