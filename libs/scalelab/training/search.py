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
k-th round runs, read by every rank of a multi-task element); summary.csv, importance.csv and
objective.png (from `collect`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from scalelab.config import ConfigError, Params, parse_params, read_yaml
from scalelab.config.overrides import apply
from scalelab.config.schema import check_best_metric, load_params
from scalelab.config.space import Dimension, corners, parse_space
from scalelab.data.store import verify
from scalelab.launch import slurm
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.lock import FolderLock
from scalelab.tracking import MlflowTracker, tracking_uri
from scalelab.training.pruning import PRUNERS, TRIAL_FILE, load_study, open_storage
from scalelab.training.submit import plan_job, resolve

log = logging.getLogger(__name__)
METHODS = ("grid", "tpe", "random")
SHAPE_KEYS = ("train.num_nodes", "train.nproc_per_node", "train.threads_per_process", "train.launcher")
MANAGED_KEYS = ("train.best_metric", "train.best_mode", "tracking.run_id")  # set by the search itself


@dataclasses.dataclass
class Search:
    """The manifest of a search: everything a worker needs, fixed at submit time."""

    name: str
    folder: str
    method: str
    trials: int
    parallel: int
    metric: str
    mode: str
    pruner: str
    space: list[dict[str, Any]]
    storage: str
    data: str
    raw: dict[str, Any]  # the params tree at submit time: a later edit of params.yaml changes nothing
    launcher: str
    heartbeat_s: float
    seed: int
    parent_run_id: str = ""
    elements: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def dims(self) -> dict[str, Dimension]:
        return {d["key"]: Dimension.from_dict(d) for d in self.space}

    def path(self, *parts: str) -> Path:
        return Path(self.folder).joinpath(*parts)

    def trial_dir(self, number: int) -> Path:
        return self.path("trials", f"{number:04d}")

    def save(self) -> None:
        atomic_write_json(self.path("manifest.json"), dataclasses.asdict(self))

    @classmethod
    def load(cls, folder: str | Path) -> Search:
        return cls(**json.loads((Path(folder) / "manifest.json").read_text()))

    def trial_params(self, values: dict[str, Any]) -> dict[str, Any]:
        """The params tree of one trial: the sampled values, and the objective as the best metric."""
        return apply(self.raw, {**values, "train.best_metric": self.metric, "train.best_mode": self.mode})


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


def plan(args: Any, folder: Path) -> Search:
    """Checks the options, the space and every bound of it, and the data; nothing is written.

    Raises:
        ConfigError, DataError: one line naming the option or key, the value and what is allowed.
    """
    if args.method not in METHODS:
        raise ConfigError(f"--method {args.method!r} is not allowed: give one of {', '.join(METHODS)}")
    if args.pruner not in PRUNERS:
        raise ConfigError(f"--pruner {args.pruner!r} is not allowed: give one of {', '.join(PRUNERS)}")
    for option, value in (("--trials", args.trials), ("--parallel", args.parallel)):
        if value is not None and value < 1:
            raise ConfigError(f"{option} {value} is not allowed: give a whole number >= 1")
    base = load_params(args.params)
    raw = read_yaml(args.params)
    metric, mode = parse_objective(args.objective, base)
    space = parse_space(args.set)
    for key in space:
        if key in SHAPE_KEYS or key in MANAGED_KEYS:
            why = "one job array has one job shape" if key in SHAPE_KEYS else "the search sets it"
            raise ConfigError(f"-S {key} is not allowed in a search: {why}")
    if args.method == "grid":
        drawn = [k for k, d in space.items() if d.kind != "choice"]
        if drawn:
            raise ConfigError(
                f"-S {drawn[0]}={space[drawn[0]].describe()}: --method grid takes lists of values; "
                "use --method tpe or random to sample a range"
            )
    trials = args.trials or (math.prod(len(d.choices) for d in space.values()) if args.method == "grid" else 0)
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
    return search


def submit(args: Any, folder: Path) -> int:
    """Plans, creates the study and the parent run, then starts the workers."""
    import optuna

    search = plan(args, folder)
    base = load_params(args.params)
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
    if search.launcher == "local":
        return run_local(search)
    profile = slurm.load_profile(base.slurm.profile)
    ex = slurm.train_executor(base, profile, name=f"sweep-{search.name}")
    ex.update_parameters(slurm_array_parallelism=search.parallel)
    with ex.batch():
        jobs = [ex.submit(SearchJob(search.folder, i)) for i in range(search.parallel)]
    search.elements = [{"index": i, "job_id": j.job_id, "log_folder": str(j.paths.folder)} for i, j in enumerate(jobs)]
    search.save()
    print(
        f"submitted search {search.name!r}: {search.method}, {search.trials} trials on {search.parallel} workers as "
        f"job array {jobs[0].job_id.split('_')[0]}; manifest: {search.path('manifest.json')}"
    )
    return 0


def run_local(search: Search) -> int:
    """`--parallel` worker processes on this machine; waits for them, then collects."""
    cmd = [sys.executable, "-m", "scalelab.cli", "sweep", "worker", "--folder", search.folder, "--index"]
    procs = [subprocess.Popen([*cmd, str(i)]) for i in range(search.parallel)]
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


# --- a worker: claims trials until the budget is spent ------------------------------------------


def claim(search: Search, worker: int, job_id: str = "") -> int | None:
    """Under the sweep's lock: fail the stale trials, then ask for a new one while the budget has
    room. Returns its number; None when the budget is spent; waits while running trials fill it."""
    import optuna

    study = load_study(info(search))
    while True:
        with FolderLock(search.path("claims"), wait=True):
            fail_stale(search, study)
            trials = study.get_trials(deepcopy=False)
            ended = [t for t in trials if t.state.is_finished() and not t.user_attrs.get("lost")]
            running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
            if len(ended) >= search.trials or len(trials) >= 2 * search.trials:
                return None  # spent (or too many trials lost: give up rather than loop)
            if len(ended) + len(running) < search.trials:
                return _new_trial(search, study, worker, job_id)
        time.sleep(min(5.0, search.heartbeat_s / 4))


def _new_trial(search: Search, study: Any, worker: int, job_id: str) -> int | None:
    """Asks for a trial and makes its folder, MLflow child run and resolved.json. A sampled point
    the params schema or the run plan refuses (a combination no bound showed) is a failed trial."""
    import optuna

    sampler = _sampler(search, len(study.get_trials(deepcopy=False)))
    study = optuna.load_study(study_name=search.name, storage=study._storage, sampler=sampler)
    dims = search.dims
    trial = study.ask({k: d.distribution() for k, d in dims.items()})
    values = {k: dims[k].value(trial.params[k]) for k in dims}
    out = search.trial_dir(trial.number)
    out.mkdir(parents=True, exist_ok=True)
    (out / "heartbeat").touch()
    try:
        params = parse_params(search.trial_params(values), f"{search.name} trial {trial.number}")
        plan_job(params, search.data)
    except ConfigError as exc:
        trial.set_user_attr("error", str(exc)[:500])
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return _new_trial(search, study, worker, job_id) if len(study.trials) < 2 * search.trials else None
    child = MlflowTracker.open(
        params.tracking.experiment,
        run_name=f"{search.name}-{trial.number:03d}",
        parent_run_id=search.parent_run_id,
        tags={"scalelab.sweep": search.name, "scalelab.trial": trial.number, "scalelab.sweep_worker": worker},
    )
    child.log_params({f"sampled.{k}": v for k, v in values.items()})
    child.client.update_run(child.run_id, status="SCHEDULED")
    for key, value in (("run_id", child.run_id), ("worker", worker), ("job_id", job_id)):
        trial.set_user_attr(key, value)
    params = dataclasses.replace(params, tracking=dataclasses.replace(params.tracking, run_id=child.run_id))
    resolve(params, search.data, out)
    atomic_write_json(out / TRIAL_FILE, {**info(search), "trial_id": trial._trial_id, "number": trial.number})
    return trial.number


def _sampler(search: Search, asked: int) -> Any:
    """A sampler seeded by the search's seed and the trial's position: parallel workers draw
    different points, and a rerun of the same history draws the same ones."""
    import optuna

    seed = search.seed * 100_003 + asked
    if search.method == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if search.method == "grid":
        grid = {k: [d.distribution().choices[i] for i in range(len(d.choices))] for k, d in search.dims.items()}
        return optuna.samplers.GridSampler(grid, seed=search.seed)
    startup = max(2, min(10, search.trials // 4))  # random points first, then the model
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True, constant_liar=True)


def info(search: Search) -> dict[str, Any]:
    return {"study": search.name, "storage": search.storage, "pruner": search.pruner, "metric": search.metric}


def fail_stale(search: Search, study: Any) -> list[int]:
    """Marks failed (and `lost`) every running trial whose heartbeat is older than the timeout."""
    import optuna

    lost = []
    now = time.time()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        beat = search.trial_dir(t.number) / "heartbeat"
        last = beat.stat().st_mtime if beat.exists() else t.datetime_start.timestamp()
        if now - last > search.heartbeat_s:
            why = f"no heartbeat for {now - last:.0f} s (sweep.heartbeat_timeout_s = {search.heartbeat_s})"
            lose(search, study, t, why)
            lost.append(t.number)
    return lost


def lose(search: Search, study: Any, trial: Any, why: str) -> None:
    """A trial whose worker died: failed, `lost` (replaced within the budget), its run FAILED."""
    import optuna

    study._storage.set_trial_user_attr(trial._trial_id, "lost", True)
    study._storage.set_trial_user_attr(trial._trial_id, "error", why)
    study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    log.warning("search %s: trial %d marked failed: %s", search.name, trial.number, why)
    run_id = trial.user_attrs.get("run_id")
    if run_id:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri())
        client.set_tag(run_id, "scalelab.trial_state", "lost")
        if client.get_run(run_id).info.status in ("SCHEDULED", "RUNNING"):
            client.set_terminated(run_id, status="FAILED")


def tell(search: Search, number: int, error: str = "") -> str:
    """Tells the study how trial `number` ended, from the files its job wrote; returns the state."""
    import optuna

    study = load_study(info(search))
    out = search.trial_dir(number)
    trial_id = json.loads((out / TRIAL_FILE).read_text())["trial_id"]
    storage = study._storage
    run_file, metrics_file = out / "run.json", out / "metrics.json"
    if error or not run_file.is_file():
        storage.set_trial_user_attr(trial_id, "error", (error or "the job wrote no run.json")[:500])
        study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        return "failed"
    reason = json.loads(run_file.read_text())["stop_reason"]
    metrics = json.loads(metrics_file.read_text())
    storage.set_trial_user_attr(trial_id, "steps", metrics["steps"])
    value = metrics.get(f"best_{search.metric}")
    if reason == "pruned":
        storage.set_trial_user_attr(trial_id, "pruned_step", metrics["steps"])
        study.tell(number, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
        return "pruned"
    if value is None or not math.isfinite(value):
        storage.set_trial_user_attr(trial_id, "error", f"no finite {search.metric} was validated")
        study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        return "failed"
    study.tell(number, value, skip_if_finished=True)
    return "finished"


class Heartbeat:
    """`with Heartbeat(folder, every_s):` touches <folder>/heartbeat until the block ends."""

    def __init__(self, folder: Path, every_s: float) -> None:
        self.path, self.every_s = folder / "heartbeat", every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            self.path.touch()

    def __enter__(self) -> Heartbeat:
        self.path.touch()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def claims(search: Search, worker: int, rank: int, job_id: str = ""):
    """The trial numbers this worker runs, in order. Rank 0 claims and writes claim-<k>.json; the
    other ranks of a multi-task element read it. A requeued element reads the claims it made
    before, so it resumes the trial it was running (unless that one was marked lost meanwhile)."""
    folder = search.path("workers", f"{worker:03d}")
    for k in range(2 * search.trials + 1):
        path = folder / f"claim-{k:03d}.json"
        if rank == 0 and not path.exists():
            atomic_write_json(path, {"number": claim(search, worker, job_id)})
        while not path.exists():
            time.sleep(0.5)
        number = json.loads(path.read_text())["number"]
        if number is None:
            return
        yield number


def is_open(search: Search, number: int) -> bool:
    """Still to run (or resume): the study has not recorded an end for it."""
    import optuna

    trial = load_study(info(search)).get_trials(deepcopy=False)[number]
    return trial.state == optuna.trial.TrialState.RUNNING


def work_local(search: Search, worker: int) -> int:
    """A local worker process: each trial through `scalelab train`'s own launcher (torchrun for
    ddp and fsdp, in this process otherwise)."""
    from scalelab.training import evaluation
    from scalelab.training.plan import read_resolved
    from scalelab.training.submit import launch

    for number in claims(search, worker, rank=0):
        if not is_open(search, number):
            continue
        out = search.trial_dir(number)
        params, _ = read_resolved(out / "resolved.json")
        error = ""
        with Heartbeat(out, search.heartbeat_s / 4):
            try:
                launch(params, search.data, out)
            except KeyboardInterrupt:
                tell(search, number, "interrupted (SIGINT)")
                raise
            except Exception as exc:  # a diverged or failed trial ends; the search goes on
                error = f"{type(exc).__name__}: {exc}"
                log.error("search %s: trial %d failed: %s", search.name, number, error)
        state = tell(search, number, error)
        if state == "finished" and params.sweep.evaluate:
            evaluation.run(params, search.data, out, out / "eval.json")
        print(f"search {search.name}: trial {number} {state}", flush=True)
    return 0


class SearchJob:
    """The callable of each SLURM array element: every task of it runs the worker's trials as
    ranks of one job (`job.run`); checkpointable (a preempted trial resumes after the requeue)."""

    def __init__(self, folder: str, worker: int) -> None:
        self.folder, self.worker = folder, worker

    def __call__(self) -> int:
        import submitit

        from scalelab.runtime.signals import StopFlag
        from scalelab.training import evaluation, job
        from scalelab.training.plan import read_resolved

        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        os.environ["SUBMITIT_FOLDER"] = str(submitit.JobEnvironment().paths.folder)
        requeue = signal.getsignal(signal.SIGUSR2)
        stop = StopFlag().arm(signal.SIGUSR2)
        search = Search.load(self.folder)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        job_id = os.environ.get("SLURM_ARRAY_JOB_ID", "") + "_" + os.environ.get("SLURM_ARRAY_TASK_ID", "")
        for number in claims(search, self.worker, rank, job_id):
            if not is_open(search, number):
                continue
            out = search.trial_dir(number)
            params, run_plan = read_resolved(out / "resolved.json")
            beat = Heartbeat(out, search.heartbeat_s / 4) if rank == 0 else None
            try:
                if beat:
                    beat.__enter__()
                summary = job.run(params, run_plan, search.data, str(out), stop=stop)
            except Exception as exc:
                if rank == 0:
                    tell(search, number, f"{type(exc).__name__}: {exc}")
                if world > 1:  # the process group may be broken: end this element (it stays failed)
                    raise
                continue
            finally:
                if beat:
                    beat.__exit__()
            if summary["preempted"]:
                if rank == 0 and callable(requeue):
                    (out / "heartbeat").touch()
                    requeue(signal.SIGUSR2, None)  # the checkpoint is on disk: requeue (and exit)
                time.sleep(300)
                raise RuntimeError("preempted, but the job was not requeued within 300 s")
            if rank == 0:
                state = tell(search, number)
                if state == "finished" and params.sweep.evaluate:
                    evaluation.run(params, search.data, out, out / "eval.json")
        return 0

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


# --- collect ------------------------------------------------------------------------------------


def collect(search: Search) -> Any:
    """summary.csv (one row per trial, with its state); once the budget is spent, the parent run
    gets the best trial, the importance table and the objective plot, and ends FINISHED."""
    import optuna
    import pandas as pd

    study = load_study(info(search))
    if search.launcher == "slurm":
        _lose_dead_elements(search, study)
    with FolderLock(search.path("claims"), wait=True):
        fail_stale(search, study)
    trials = study.get_trials(deepcopy=False)
    dims = search.dims
    rows = []
    for t in trials:
        state = {"COMPLETE": "finished", "PRUNED": "pruned", "FAIL": "failed"}.get(t.state.name, "running")
        rows.append(
            {
                "trial": t.number,
                "state": state,
                "value": t.value if t.state == optuna.trial.TrialState.COMPLETE else None,
                **{
                    f"param.{k}": json.dumps(dims[k].value(v)) if dims[k].kind == "choice" else v
                    for k, v in t.params.items()
                },  # fmt: skip
                "steps": t.user_attrs.get("steps"),
                "pruned_step": t.user_attrs.get("pruned_step"),
                "lost": bool(t.user_attrs.get("lost")),
                "run_id": t.user_attrs.get("run_id"),
                "error": t.user_attrs.get("error", ""),
            }
        )
    frame = pd.DataFrame(rows)
    out = search.path("summary.csv")
    frame.to_csv(out, index=False)
    ended = sum(1 for t in trials if t.state.is_finished() and not t.user_attrs.get("lost"))
    print(f"{frame.drop(columns=['run_id']).to_string(index=False, max_colwidth=60)}\n-> {out}")
    if ended >= search.trials or (trials and not any(t.state == optuna.trial.TrialState.RUNNING for t in trials)
                                  and _workers_done(search)):  # fmt: skip
        _finish_parent(search, study, frame)
    return frame


def _workers_done(search: Search) -> bool:
    if search.launcher == "local":
        return True  # collect runs after the local workers have ended
    return all(slurm.has_ended(_element(e).state) for e in search.elements)


def _element(e: dict[str, Any]) -> Any:
    import submitit

    return submitit.SlurmJob(folder=e["log_folder"], job_id=e["job_id"])


def _lose_dead_elements(search: Search, study: Any) -> None:
    """A running trial whose array element has ended (scancel, a failure) is lost now, without
    waiting for its heartbeat to go stale."""
    import optuna

    dead = {e["job_id"] for e in search.elements if slurm.has_ended(_element(e).state)}
    with FolderLock(search.path("claims"), wait=True):
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if t.user_attrs.get("job_id") in dead:
                lose(search, study, t, "its SLURM array element ended (scancel, or a failure)")


def _finish_parent(search: Search, study: Any, frame: Any) -> None:
    """Best trial, importance table and objective plot into the parent run; ends it FINISHED."""
    import optuna
    from mlflow import MlflowClient

    if MlflowClient(tracking_uri()).get_run(search.parent_run_id).info.status == "FINISHED":
        return  # an earlier collect finished it
    parent = MlflowTracker.attach(search.parent_run_id)
    counts = frame.state.value_counts().to_dict()
    steps = frame.steps.fillna(0).sum()
    parent.log_metrics(
        {
            "trials_finished": counts.get("finished", 0),
            "trials_pruned": counts.get("pruned", 0),
            "trials_failed": counts.get("failed", 0),
            "compute_steps": float(steps),
        },
        0,
    )
    done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if done:
        best = study.best_trial
        parent.log_metrics({f"best_{search.metric}": best.value}, 0)
        parent.set_tags(
            {
                "scalelab.best_trial": best.number,
                "scalelab.best_run_id": best.user_attrs.get("run_id", ""),
                f"scalelab.best_{search.metric}": best.value,
            }
        )
        print(f"best: trial {best.number}, {search.metric} = {best.value:.6g}, run {best.user_attrs.get('run_id')}")
    importance = search.path("importance.csv")
    _importance(study).to_csv(importance, index=False)
    parent.log_artifact(importance)
    parent.log_artifact(search.path("summary.csv"))
    if done:
        plot = search.path("objective.png")
        _plot(study, search, plot)
        parent.log_artifact(plot)
    parent.finish("FINISHED")


def _importance(study: Any) -> Any:
    """fANOVA importance of each sampled key (empty, with the reason, when it cannot be computed)."""
    import optuna
    import pandas as pd

    try:
        scores = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)
        )
        return pd.DataFrame({"param": list(scores), "importance": list(scores.values()), "note": ""})
    except (ValueError, RuntimeError) as exc:
        return pd.DataFrame({"param": [], "importance": [], "note": [str(exc)]})


def _plot(study: Any, search: Search, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna

    done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    xs, ys = [t.number for t in done], [t.value for t in done]
    best = [min(ys[: i + 1]) if search.mode == "min" else max(ys[: i + 1]) for i in range(len(ys))]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.scatter(xs, ys, s=14, label="finished trial")
    ax.step(xs, best, where="post", color="C1", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(search.metric)
    ax.set_title(f"sweep {search.name}: {search.method}, pruner {search.pruner}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
