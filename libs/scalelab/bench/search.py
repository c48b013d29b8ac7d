"""Search methods on one budget: TPE with median pruning, random and grid, best objective and compute."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import yaml

from scalelab.bench import harness, pipeline, stats
from scalelab.bench.harness import Goal, opt, timed
from scalelab.runtime.paths import PACKAGE_ROOT

METHOD = """\
Each arm: one `scalelab sweep submit` here (`sweep.launcher: local`) in its own temporary folder and MLflow store, on
params.yaml shrunk to a tiny digits MLP (sgd, one process); objective val_loss:min over the learning rate (log, 1e-4 to
1) and the hidden width (16 or 64), the same trial budget. Arms: `tpe` with `--pruner median`, `random`, `grid` (6
log-spaced rates x 2 widths). Per arm: the best val_loss of a finished trial, the steps the trials ran (pruned ones up
to their stop), trial states, wall time. A repeat runs every arm in turn on its own train.seed (busy repeats retried,
then dropped); per arm the median over repeats.
"""
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
    """One arm's sweep on train.seed `seed`: its best val_loss, compute, trial states and wall time."""
    import pandas as pd

    method, pruner, space = ARMS[name]
    folder = work / f"{name}-{seed}"
    folder.mkdir(parents=True)
    pipeline.write_params(folder / "params.yaml", _params(PACKAGE_ROOT, args.epochs, seed))  # a repository of its own
    cmd = ["sweep", "submit", "--name", "b", "--data", str(data), "--method", method, "--pruner", pruner]
    cmd += ["--trials", str(args.trials), "--parallel", str(args.parallel)]
    cmd += [arg for key, text in space.items() for arg in ("-S", f"{key}={text}")]
    wall_s = timed(pipeline.scalelab, *cmd, cwd=folder, env=pipeline.store_env(folder, tracking=False))
    rows = pd.read_csv(folder / "results/sweeps/b/summary.csv")
    finished = rows.value[rows.state == "finished"]  # a pruned trial's value is where it stopped, not a result
    values = [v for v in finished if isinstance(v, float) and math.isfinite(v)]
    return {
        "arm": name, "seed": seed, "best_val_loss": min(values) if values else None,
        "compute_steps": int(rows.steps.fillna(0).sum()), "trials": len(rows),
        "states": rows.state.value_counts().to_dict(), "wall_s": wall_s,
    }  # fmt: skip


def measure(ctx: harness.Context) -> dict[str, Any]:
    from scalelab.config import DataConfig, build
    from scalelab.data.prepare import prepare

    args, data = ctx.args, ctx.work / "data"
    prepare(build(DataConfig, {}), data)
    reps = harness.take_repeats(lambda seed: [run_arm(ctx.work, name, args, seed, data) for name in ARMS], ctx.policy())
    runs = [run for repeat in reps.kept for run in repeat]
    arms = {name: {} for name in ARMS}
    for name, key in itertools.product(ARMS, ("best_val_loss", "compute_steps", "wall_s")):
        values = [r[key] for r in runs if r["arm"] == name and r[key] is not None]
        arms[name][f"{key}_median"] = stats.median(values) if values else None
    best = {n: a["best_val_loss_median"] for n, a in arms.items()}
    ratio = None if None in (best["tpe_median"], best["random"]) else best["tpe_median"] / best["random"]  # goal <= 1
    fewer = arms["tpe_median"]["compute_steps_median"] < arms["random"]["compute_steps_median"]  # and with fewer steps
    loss = {n: "none" if b is None else f"{b:.4f}" for n, b in best.items()}
    figure = "; ".join(f"{n} best val_loss {loss[n]} in {a['compute_steps_median']:.0f} steps" for n, a in arms.items())
    ctx.figure("search", figure, ratio, GOAL, also=fewer, dropped=reps.dropped)
    settings = {key: getattr(args, key) for key in ("trials", "parallel", "epochs", "repeats")}
    return settings | {"arms": arms, "runs": runs, **reps.json()}


OPTIONS = (
    opt("--trials", len(GRID_LRS) * 2, "the budget of every arm"),
    opt("--parallel", 2, "local workers of every arm"),
    opt("--epochs", 4, "train.epochs of every trial"),
    opt("--repeats", 1, "seeds per arm"),
)
BENCH = harness.Benchmark("search", "search.json", METHOD, measure, OPTIONS, scratch_outside=True)
