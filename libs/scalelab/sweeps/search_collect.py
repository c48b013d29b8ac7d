"""`scalelab sweep collect` of a search: summary.csv (and summary_by_setting.csv when train.seed is
swept), the best trial so far with its run id, and once the budget is spent, the parent run's best
trial, importance table and objective plot (scalelab.sweeps.search runs the trials)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scalelab.launch import slurm
from scalelab.runtime.lock import FolderLock
from scalelab.sweeps.manifest import Search, info
from scalelab.sweeps.search_worker import fail_stale, lose
from scalelab.sweeps.sweep_table import BY_SETTING_FILE, best_line, by_setting, write_by_setting
from scalelab.tracking import MlflowTracker
from scalelab.training.pruning import load_study


def reported_value(trial: Any) -> float | None:
    """A trial's value as `sweep status` and summary.csv's `value` column show it: a finished
    trial's objective (its best validation value), a pruned trial's last reported one (the
    objective at the validation it was pruned at), else None."""
    import optuna

    if trial.state == optuna.trial.TrialState.COMPLETE:
        return trial.value
    if trial.state == optuna.trial.TrialState.PRUNED and trial.last_step is not None:
        return trial.intermediate_values[trial.last_step]
    return None


def collect(search: Search) -> Any:
    """summary.csv (one row per trial, with its state, value and run id) and the best trial so far,
    printed; once the budget is spent, the parent run gets the best trial, the importance table and
    the objective plot, and ends FINISHED."""
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
                "value": reported_value(t),
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
    print(f"{frame.to_string(index=False, max_colwidth=60)}\n-> {out}")
    finished = frame.state == "finished" if len(frame) else None
    table = by_setting(frame, "param.", {"value": f"best_{search.metric}"}, finished) if len(frame) else None
    if table is not None:
        print(write_by_setting(table, Path(search.folder)))
    if any(t.state == optuna.trial.TrialState.COMPLETE for t in trials):  # the one the parent run gets
        best = study.best_trial
        print(best_line(f"trial {best.number}", search.metric, best.value, best.user_attrs.get("run_id")))
    else:
        print(best_line(None, search.metric, None, None))
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

    from scalelab.tracking import runs

    if runs.status(search.parent_run_id) == "FINISHED":
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
    importance = search.path("importance.csv")
    _importance(study).to_csv(importance, index=False)
    parent.log_artifact(importance)
    parent.log_artifact(search.path("summary.csv"))
    if search.path(BY_SETTING_FILE).is_file():
        parent.log_artifact(search.path(BY_SETTING_FILE))
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
