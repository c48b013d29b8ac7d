"""Sweeps that search: Optuna samples and prunes, SLURM (or this machine) runs the trials, MLflow
records each one.

    scalelab sweep submit --name lr --method tpe --trials 40 --parallel 4 --objective val_loss:min \\
        --pruner median -S 'train.lr=loguniform(1e-4,1e-1)' -S 'train.lr_warmup_steps=int(0,200)'

`submit` checks the whole space (every bound and choice through the params schema and the run
plan) before anything exists, creates the Optuna study, the sweep's parent run and
`results/sweeps/<name>/manifest.json`, then starts `--parallel` workers: the elements of one SLURM
job array (returns at once), or processes here (`sweep.launcher: local`, waits). Each worker
repeats, until the budget of `--trials` ended trials is spent: ask the study for a trial, make
its MLflow child run, train it (its pruner may stop it at a validation), tell the study the best
validation value. A trial whose worker died (scancel, a lost node) stops beating; after
`sweep.heartbeat_timeout_s` any worker marks it failed, and it does not count against the budget.
A preempted element is requeued and resumes its trial, in the same run, from its checkpoint.

results/sweeps/<name>/: manifest.json; optuna.journal (the study, when sweep.storage names no
database); trials/<number>/ (the trial's job folder: trial.json, resolved.json, checkpoints,
model.pt, run.json, metrics.json, heartbeat); workers/<i>/claim-<k>.json (the trial a worker's
k-th round runs, read by every rank of a multi-task element); summary.csv, summary_by_setting.csv
(when train.seed is swept), importance.csv and objective.png (from `collect`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scalelab.config import ConfigError, Params, names, parse_params
from scalelab.config.schema import TrainConfig, check_best_metric
from scalelab.config.space import corners, parse_space
from scalelab.data.store import verify
from scalelab.launch import slurm
from scalelab.runtime.device import cuda_device_count
from scalelab.sweeps.manifest import SHAPE_KEYS, Search
from scalelab.sweeps.samplers import grid_points
from scalelab.sweeps.search_collect import collect
from scalelab.sweeps.search_worker import SearchJob
from scalelab.tracking import MlflowTracker, tracking_uri
from scalelab.training.pruning import open_storage
from scalelab.training.submit import plan_job

MANAGED_KEYS = ("train.best_metric", "train.best_mode", "tracking.run_id")  # set by the search itself


def parse_objective(text: str, params: Params) -> tuple[str, str]:
    """'val_loss:min' -> ('val_loss', 'min'); the metric must be one validation logs for this data."""
    metric, _, mode = text.partition(":")
    if mode not in ("min", "max"):
        raise ConfigError(f"--objective {text!r} is not allowed: write <metric>:min or <metric>:max, e.g. val_loss:min")
    try:
        check_best_metric(metric, params.data)
    except ConfigError as exc:
        raise ConfigError(f"--objective {text!r}: {str(exc).removeprefix('train.best_metric = ')}") from None
    return metric, mode


def plan(args: Any, folder: Path, raw: dict[str, Any], specs: list[str]) -> Search:
    """Checks the options, the space (`specs`) and every bound of it, and the data; nothing is
    written. `raw` is the params tree with the command's settings applied (`sweep.settings`).

    Raises:
        ConfigError, DataError: one line naming the option or key, the value and what is allowed.
    """
    names.check("--method", args.method, names.SAMPLERS)
    names.check("--pruner", args.pruner, names.PRUNERS)
    for option, value in (("--trials", args.trials), ("--parallel", args.parallel)):
        if value is not None and value < 1:
            raise ConfigError(f"{option} {value} is not allowed: give a whole number >= 1")
    base = parse_params(raw, args.params)
    metric, mode = parse_objective(args.objective, base)
    space = parse_space(specs)
    for key in space:
        if key in SHAPE_KEYS or key in MANAGED_KEYS:
            why = "one job array has one job shape" if key in SHAPE_KEYS else "the search sets it"
            raise ConfigError(f"-S {key} is not allowed in a search: {why}")
    trials = args.trials or (len(grid_points(space)) if args.method == "grid" else 0)  # grid: refuses a range
    if not trials:
        raise ConfigError(f"--trials is required with --method {args.method}: give the budget, e.g. --trials 20")
    search = Search(
        name=args.name,
        folder=str(folder.resolve()),
        method=args.method,
        trials=trials,
        parallel=args.parallel or base.sweep.array_parallelism,
        metric=metric,
        mode=mode,
        pruner=args.pruner,
        space=[d.to_dict() for d in space.values()],
        storage=base.sweep.storage or str(folder.resolve() / "optuna.journal"),
        data=str(Path(args.data).resolve()),
        raw=raw,
        launcher=base.sweep.launcher,
        heartbeat_s=base.sweep.heartbeat_timeout_s,
        seed=base.train.seed,
    )
    if search.storage.startswith("sqlite"):
        raise ConfigError(
            f"sweep.storage = {search.storage!r}: a bare SQLite file breaks under parallel trials; "
            "give a PostgreSQL URL, or leave it empty for a journal file in the sweep's folder"
        )
    verify(args.data)
    checked = []
    for values in corners(space):
        try:
            params = parse_params(search.trial_params(values), args.params)
            plan_job(params, args.data)  # a batch larger than the split, a model that cannot be built
        except ConfigError as exc:
            raise ConfigError(f"search trial {values}: {exc}") from None
        checked.append(params)
    if search.launcher == "slurm":
        profile = slurm.load_profile(base.slurm.profile)
        for params in checked:
            slurm.preflight(params, profile, tracking_uri())
    else:
        worker_gpus(base.train, search.parallel, visible_gpus())  # enough GPUs for every worker
    return search


@contextmanager
def abandoned_on_failure(parent: MlflowTracker, folder: Path, children: list[str] = ()) -> Iterator[None]:
    """A submission that fails ends its parent run (and the `children` made so far) FAILED and
    frees the sweep's name (its folder goes); an error from the SLURM client becomes one line
    (`slurm.refused`)."""
    try:
        yield
    except BaseException as exc:
        for run_id in children:
            parent.client.set_terminated(run_id, status="FAILED")
        parent.finish("FAILED")
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(exc, Exception) and getattr(exc, "exit_status", None) is None:
            raise slurm.refused(exc) from None
        raise


def submit(args: Any, folder: Path, raw: dict[str, Any], specs: list[str]) -> int:
    """Plans, creates the study and the parent run, then starts the workers."""
    import optuna

    search = plan(args, folder, raw, specs)
    base = parse_params(raw, args.params)
    ex = None
    if search.launcher == "slurm":  # no SLURM client here: fails before any study, run or folder
        ex = slurm.train_executor(base, slurm.load_profile(base.slurm.profile), name=f"sweep-{search.name}")
        ex.update_parameters(slurm_array_parallelism=search.parallel)
    folder.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(
        study_name=search.name,
        storage=open_storage(search.storage),
        direction="minimize" if search.mode == "min" else "maximize",
        load_if_exists=True,
    )
    parent = MlflowTracker.open(
        base.tracking.experiment,
        run_name=f"sweep-{search.name}",
        tags={"scalelab.kind": "sweep", "scalelab.sweep": search.name, "scalelab.sweep_method": search.method},
    )
    parent.log_params(
        {
            "method": search.method,
            "trials": search.trials,
            "parallel": search.parallel,
            "objective": f"{search.metric}:{search.mode}",
            "pruner": search.pruner,
            **{f"space.{k}": d.describe() for k, d in search.dims.items()},
        }
    )
    search.parent_run_id = parent.run_id
    search.save()
    if ex is None:
        return run_local(search)
    with abandoned_on_failure(parent, folder), ex.batch():
        jobs = [ex.submit(SearchJob(search.folder, i)) for i in range(search.parallel)]
    search.elements = [{"index": i, "job_id": j.job_id, "log_folder": str(j.paths.folder)} for i, j in enumerate(jobs)]
    search.save()
    print(
        f"submitted search {search.name!r}: {search.method}, {search.trials} trials on {search.parallel} workers as "
        f"job array {jobs[0].job_id.split('_')[0]}; manifest: {search.path('manifest.json')}"
    )
    return 0


def visible_gpus() -> list[str]:
    """The GPUs this process sees, as CUDA_VISIBLE_DEVICES names them (or their indices)."""
    count = cuda_device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [d.strip() for d in listed.split(",") if d.strip()] if listed is not None else []
    return (names or [str(i) for i in range(count)])[:count]


def worker_gpus(train: TrainConfig, parallel: int, visible: list[str]) -> list[str | None]:
    """Each local worker's CUDA_VISIBLE_DEVICES: its own `train.nproc_per_node` GPUs, none shared;
    None (inherit) where the trials run on the CPU.

    Raises:
        ConfigError: the workers need more GPUs than are visible.
    """
    if not visible or train.device == "cpu":
        return [None] * parallel
    each = train.nproc_per_node
    if parallel * each > len(visible):
        raise ConfigError(
            f"sweep.parallel = {parallel} is not allowed: {parallel} local workers x {each} GPUs "
            f"(train.nproc_per_node) need {parallel * each} GPUs; this machine has {len(visible)}; "
            f"use at most {max(1, len(visible) // each)}"
        )
    return [",".join(visible[i * each : (i + 1) * each]) for i in range(parallel)]


def run_local(search: Search) -> int:
    """`--parallel` worker processes on this machine, each on its own GPUs; waits for them, then
    collects."""
    cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "worker", "--folder", search.folder, "--index"]
    gpus = worker_gpus(parse_params(search.raw, "the sweep's manifest").train, search.parallel, visible_gpus())
    procs = [
        subprocess.Popen([*cmd, str(i)], env=os.environ | ({"CUDA_VISIBLE_DEVICES": g} if g else {}))
        for i, g in enumerate(gpus)
    ]
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        raise
    collect(search)
    return 0 if not any(codes) else 1
