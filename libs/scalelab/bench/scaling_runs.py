"""The two whole-command curves of `scalelab bench scaling`: the speedup study's wall time against
its number of cells, and `scalelab reproduce`'s time against the length of the run it reruns.

Both time real commands as fresh processes (`python -m scalelab.cli ...`), as dvc.yaml and a user
run them; scaling.METHOD says how. Kept apart from scaling.py, which holds the in-process curves.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from scalelab.bench import pipeline
from scalelab.bench.dvc_repro import copy_repo
from scalelab.config import DataConfig, build
from scalelab.data.prepare import prepare
from scalelab.launch.local import worker_command
from scalelab.runtime.paths import PACKAGE_ROOT
from scalelab.training.plan import RESOLVED_FILE, RUN_FILE

STUDY_BATCH = 64  # cell i runs batch STUDY_BATCH + i: nearly equal work, a distinct cell each
STUDY = {
    "workload": "mlp",
    "model": {"hidden": [64], "dropout": 0.0},
    "num_features": 32,
    "strategies": ["ddp"],  # one setup (ddp-w1) on any machine: `single` adds a setup per thread count
    "world_sizes": [1],
    "precisions": ["fp32"],
    "compile": [False],
    "device": "cpu",
    "warmup_steps": 1,
    "timed_steps": 2,
    "repeats": 2,
}
STEPS_PER_EPOCH = 10
# 457 synthetic samples split 320 / 46 / 91 (train / val / test): 10 steps of 32 per epoch
RUN_DATA = {"source": "synthetic", "synthetic": {"num_samples": 457, "num_features": 32}}
RUN_TRAIN = {
    "strategy": "single",
    "nproc_per_node": 1,
    "threads_per_process": 1,
    "device": "cpu",
    "batch_size": 32,
    "model": {"hidden": [32], "dropout": 0.0},
    "untimed_steps": 2,
}


def _base_params(root: Path) -> dict[str, Any]:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["tracking"].update(experiment="bench-scaling", enabled=True, system_metrics_interval_s=0.0)
    return params


def _scalelab(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    """Runs `scalelab ARGS` as a fresh process; returns (wall seconds, the finished process)."""
    start = time.perf_counter()
    proc = subprocess.run(worker_command(args), cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, proc


def _tail(proc: subprocess.CompletedProcess) -> str:
    return " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])[-1500:]


def study_params(cells: int) -> dict[str, Any]:
    """params.yaml for a study of `cells` cells: STUDY at batch sizes STUDY_BATCH, +1, ..."""
    params = _base_params(PACKAGE_ROOT)
    params["speedup"].update(STUDY, batch_sizes=[STUDY_BATCH + i for i in range(cells)])
    return params


def study_costs(cells: list[int], work: Path) -> dict[str, list[float]]:
    """Wall time of a whole `scalelab speedup` with N cells, each study in a fresh folder."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    wall, per_cell = [], []
    for n in cells:
        folder = work / f"study-{n}"
        folder.mkdir()
        pipeline.write_params(folder / "params.yaml", study_params(n))  # a repository of its own
        args = ["speedup", "--params", "params.yaml", "--out", "out", "--cells", "cells"]  # a fresh cell cache
        wall_s, proc = _scalelab(args, folder, env)
        if proc.returncode != 0:
            raise RuntimeError(f"scalelab speedup ({n} cells) exited {proc.returncode}: {_tail(proc)}")
        measured = proc.stderr.count("measuring ")
        if measured != n:
            raise RuntimeError(f"the {n}-cell study measured {measured} cells: {_tail(proc)}")
        wall.append(wall_s)
        per_cell.append(wall_s / n)
    return {"wall_s": wall, "per_cell_s": per_cell}


def _git(repo: Path, *args: str) -> None:
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, *args], cwd=repo, check=True, capture_output=True)


def reproduce_costs(run_steps: list[int], work: Path) -> dict[str, list[float]]:
    """Trains a tracked run of each length in a committed copy of the repository, then times
    `scalelab reproduce` of each; returns both wall times and the steps each run planned."""
    bad = [s for s in run_steps if s % STEPS_PER_EPOCH]
    if bad:
        raise ValueError(f"--run-steps {bad}: each must be a multiple of {STEPS_PER_EPOCH} (steps per epoch)")
    tmp = Path(tempfile.mkdtemp(prefix="scalelab-bench-scaling-"))  # outside any checkout
    try:
        return _reproduce_costs(run_steps, copy_repo(PACKAGE_ROOT, tmp / "repo"), work)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _reproduce_costs(run_steps: list[int], repo: Path, work: Path) -> dict[str, list[float]]:
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "bench copy")
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "PYTHONPATH": os.pathsep.join([str(repo / "libs"), str(repo), os.environ.get("PYTHONPATH", "")]),
    }
    base = _base_params(repo)
    base["data"].update(RUN_DATA)
    prepare(build(DataConfig, base["data"]), repo / "data/prepared")  # not timed; ignored by git
    train_s, reproduce_s, steps, matched = [], [], [], []
    for n in run_steps:
        params = {**base, "train": {**base["train"], **RUN_TRAIN, "epochs": n // STEPS_PER_EPOCH}}
        path = repo / "results" / f"params-{n}.yaml"  # in the copy (its repository), ignored by git: a clean tree
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(params, sort_keys=False))
        out = repo / f"results/train-{n}"
        args = ["train", "--params", str(path), "--data", "data/prepared", "--out", str(out.relative_to(repo))]
        wall_s, proc = _scalelab(args, repo, env)
        if proc.returncode != 0:
            raise RuntimeError(f"scalelab train ({n} steps) exited {proc.returncode}: {_tail(proc)}")
        train_s.append(wall_s)
        steps.append(json.loads((out / RESOLVED_FILE).read_text())["plan"]["total_steps"])
        run_id = json.loads((out / RUN_FILE).read_text())["run_id"]
        wall_s, proc = _scalelab(["reproduce", run_id, "--yes"], repo, env)
        if proc.returncode not in (0, 1):  # 1: ran, but a figure differed (still a timing)
            raise RuntimeError(f"scalelab reproduce ({n} steps) exited {proc.returncode}: {_tail(proc)}")
        reproduce_s.append(wall_s)
        matched.append(proc.returncode == 0)
    return {"reproduce_s": reproduce_s, "train_s": train_s, "steps": steps, "matched": matched}
