"""A search's workers: each claims trials from the study until the budget is spent, trains them,
and tells the study how they ended (scalelab.sweeps.search plans and starts them).

A SLURM array element (`SearchJob`) runs its trials as ranks of one job; a local worker
(`work_local`, `scalelab sweep worker`) runs each through `scalelab train`'s own launcher. Rank 0
claims under the sweep's lock and writes workers/<i>/claim-<k>.json for the other ranks; while a
trial trains, rank 0 touches trials/<number>/heartbeat, and a trial whose heartbeat goes stale is
marked failed (`lost`) by the next claim, which asks a replacement within the budget.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from scalelab.config import ConfigError, parse_params
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.lock import FolderLock
from scalelab.sweeps.manifest import Search, info
from scalelab.sweeps.samplers import make_sampler
from scalelab.tracking import MlflowTracker
from scalelab.training.pruning import TRIAL_FILE, load_study
from scalelab.training.submit import plan_job, resolve

log = logging.getLogger(__name__)


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

    sampler = make_sampler(search.method, search.dims, study, search.seed, search.trials)
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
        from scalelab.tracking import runs

        runs.set_tag(run_id, "scalelab.trial_state", "lost")
        runs.end_if_open(run_id, "FAILED")


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


RANK0_WAIT_MIN_S = 60.0  # the least a rank waits for rank 0's claim and decision files


def claims(search: Search, worker: int, rank: int, job_id: str = "", attempt: str = "0"):
    """The trial numbers this worker runs, in order. Rank 0 claims (claim-<k>.json) and decides
    whether the trial is still open (open-<k>-<attempt>.json: decided once per start of the
    element, since a requeued element resumes its trial unless that one was marked lost
    meanwhile); the other ranks of a multi-task element read both, so every rank runs the same
    trials (ranks that asked the study each on its own could disagree, and the job would hang)."""
    folder = search.path("workers", f"{worker:03d}")
    for k in range(2 * search.trials + 1):
        path = folder / f"claim-{k:03d}.json"
        if rank == 0 and not path.exists():
            atomic_write_json(path, {"number": claim(search, worker, job_id)})
        number = written_by_rank0(path, search)["number"]
        if number is None:
            return
        decided = folder / f"open-{k:03d}-{attempt}.json"
        if rank == 0:
            atomic_write_json(decided, {"open": is_open(search, number)})
        if written_by_rank0(decided, search)["open"]:
            yield number


def written_by_rank0(path: Path, search: Search) -> dict[str, Any]:
    """The JSON file rank 0 writes, once it is there; a rank that waits longer than a heartbeat
    timeout (rank 0 died or hangs) fails the element rather than waiting forever."""
    wait_s = max(RANK0_WAIT_MIN_S, 2 * search.heartbeat_s)
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"rank 0 did not write {path} within {wait_s:.0f} s: it died or hangs")
        time.sleep(0.2)
    return json.loads(path.read_text())


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

    for number in claims(search, worker, rank=0, attempt=str(os.getpid())):
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

        from scalelab.launch import slurm
        from scalelab.runtime.signals import StopFlag, wait_for_requeue
        from scalelab.training import evaluation, job
        from scalelab.training.plan import read_resolved

        slurm.export_rank_env()
        os.environ["SUBMITIT_FOLDER"] = str(submitit.JobEnvironment().paths.folder)
        requeue = signal.getsignal(signal.SIGUSR2)
        # USR2: preempted (checkpoint, requeue, resume the trial); SIGTERM: cancelled (scancel, which
        # kills only after KillWait): the trial stops at once, is lost and replaced, the element ends
        stop = StopFlag().arm(signal.SIGUSR2, signal.SIGTERM)
        search = Search.load(self.folder)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        job_id = os.environ.get("SLURM_ARRAY_JOB_ID", "") + "_" + os.environ.get("SLURM_ARRAY_TASK_ID", "")
        attempt = os.environ.get("SLURM_RESTART_COUNT", "0")  # a requeued element decides anew
        for number in claims(search, self.worker, rank, job_id, attempt):
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
            if summary["preempted"] and stop.signal == signal.SIGTERM:
                if rank == 0:
                    with FolderLock(search.path("claims"), wait=True):
                        study = load_study(info(search))
                        lose(search, study, study.trials[number], "its SLURM array element was cancelled (SIGTERM)")
                return 0
            if summary["preempted"]:
                if rank == 0 and callable(requeue):
                    (out / "heartbeat").touch()
                    requeue(signal.SIGUSR2, None)  # the checkpoint is on disk: requeue (and exit)
                wait_for_requeue()  # every rank: the requeue's SIGTERM ends the task
            if rank == 0:
                state = tell(search, number)
                if state == "finished" and params.sweep.evaluate:
                    evaluation.run(params, search.data, out, out / "eval.json")
        return 0

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)
