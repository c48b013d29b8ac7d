"""DVC's experiment workflow keeps every MLflow run: queued, `--temp`, applied, forced reruns, bad
params, another working folder, Ctrl-C.

One committed baseline (`dvc repro` of a tiny pipeline with a two-cell study) is built once per
module; each test works in its own copy of it (git, DVC cache, mlflow.db and results included),
so the tests pass alone and in any order.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from helpers import (
    BIN,
    copy_repo,
    kept_its_cells,
    once_more_if_heap_crash,
    output_tail,
    queue_logs,
    run_cli,
    says_why,
    tiny_params,
    wait_for,
    write_params,
)

# one worker runs the module: the baseline (a `dvc repro`, over a minute) is built once, not per worker
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("dvc-experiments")]

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@e"]
STUDY = {  # single-t1, single-t2 and ddp-w2: seconds each
    "model": {"hidden": [32], "dropout": 0.0},
    "num_features": 16,
    "batch_sizes": [32],
    "device": "cpu",
    "warmup_steps": 1,
    "timed_steps": 2,
    "repeats": 2,
    "world_sizes": [2],
    "strategies": ["single", "ddp"],
}


def commit(repo: Path, message: str) -> None:
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run([*GIT, "commit", "-qm", message], cwd=repo, check=True)


def store(repo: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")


def train_runs(repo: Path) -> list:
    client = store(repo)
    exp = client.get_experiment_by_name("scalelab")
    return client.search_runs([exp.experiment_id], "tags.`scalelab.kind` = 'train'", order_by=["attribute.start_time"])


def cell_files(repo: Path) -> dict[str, float]:
    """The study's cell cache of the main repository: file -> mtime."""
    return {p.name: p.stat().st_mtime for p in (repo / "results/speedup/cells").glob("*-*.json")}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    """A repository copy with tiny params, `dvc repro` run and everything committed (dvc.lock and
    the metrics files as the README says)."""
    repo = copy_repo(tmp_path_factory.mktemp("baseline") / "repo")
    write_params(repo / "params.yaml", tiny_params(speedup=STUDY))
    commit(repo, "tiny params")
    run_cli("dvc", "repro", cwd=repo, timeout=900)
    commit(repo, "baseline results")
    return repo


@pytest.fixture
def repo(baseline, tmp_path) -> Path:
    """This test's own copy of the baseline."""
    dest = tmp_path / "repo"
    shutil.copytree(baseline, dest, symlinks=True)
    return dest


def test_queued_and_temp_experiments_keep_their_runs_and_measure_no_cell(repo):
    [base] = train_runs(repo)
    cells = cell_files(repo)
    # the baseline measured the study into the main repository's cache (unless, on a machine busy
    # enough to make a cell invalid, it kept none there; the check below holds either way)
    assert cells or not kept_its_cells(pd.read_csv(repo / "results/speedup/speedup.csv"))
    run_cli("dvc", "exp", "run", "--queue", "-S", "train.lr=0.002", "-n", "lr2", cwd=repo)
    run_cli("dvc", "exp", "run", "--queue", "-S", "train.lr=0.004", "-n", "lr4", cwd=repo)
    run_cli("dvc", "queue", "start", "-j", "2", cwd=repo)
    logs = queue_logs(repo, "lr2", "lr4")
    wait_for(
        lambda: not {"Queued", "Running"} & set(queue_states(repo)), 600, "the queue", log=logs, poll_s=QUEUE_POLL_S
    )
    assert queue_states(repo) == ["Success", "Success"], output_tail(logs)
    # (its target is train: what it shows, a run of its own, needs no evaluate)
    run_cli("dvc", "exp", "run", "--temp", "-S", "train.epochs=3", "-n", "three", "train", cwd=repo, timeout=600)

    runs = {r.data.tags.get("dvc.exp_name"): r for r in train_runs(repo)}
    assert set(runs) == {None, "lr2", "lr4", "three"}, list(runs)  # None: the baseline's `dvc repro`
    for name, lr, epochs in (("lr2", "0.002", "2"), ("lr4", "0.004", "2"), ("three", "0.003", "3")):
        run = runs[name]
        assert run.info.status == "FINISHED" and run.info.run_name == f"ddp-w2-fp32-seed0-{name}"
        assert (run.data.params["train.lr"], run.data.params["train.epochs"]) == (lr, epochs)
        assert run.data.tags["dvc.exp_baseline_rev"] == git_head(repo)
        assert run.data.tags["git.commit"] == git_head(repo)  # a temporary copy of this commit ran it
    assert runs[None].info.run_id == base.info.run_id
    assert not list((repo / ".dvc/tmp/exps").glob("*/mlflow.db"))  # no store left behind in a copy
    assert cell_files(repo) == cells  # no study cell measured again: the speedup stage did not change

    shown = json.loads(run_cli("dvc", "exp", "show", "--json", cwd=repo).stdout)
    exps = {e["name"]: e["revs"][0]["data"] for row in shown for e in (row.get("experiments") or [])}
    base_speedup = json.loads((repo / "results/speedup/speedup.json").read_text())  # stated, or withheld (busy)
    for name in ("lr2", "lr4"):
        assert exps[name]["metrics"]["results/speedup/speedup.json"]["data"] == base_speedup
    # each experiment's own params and metrics, as `dvc exp show` and `dvc metrics diff` read them
    assert exps["lr2"]["params"]["params.yaml"]["data"]["train"]["lr"] == 0.002
    accuracy = exps["lr2"]["metrics"]["results/eval/metrics.json"]["data"]["test_accuracy"]
    assert 0.0 < accuracy <= 1.0, exps["lr2"]["metrics"]
    diff = json.loads(run_cli("dvc", "metrics", "diff", "HEAD", "lr2", "--all", "--json", cwd=repo).stdout)
    assert diff["results/eval/metrics.json"]["test_accuracy"]["new"] == accuracy

    run_cli("dvc", "exp", "apply", "lr2", cwd=repo)  # the run id travels with the experiment's outputs
    assert json.loads((repo / "results/train/run.json").read_text())["run_id"] == runs["lr2"].info.run_id


# each look at the queue is a `dvc` process (~1 s of CPU): polled back to back, they took as much
# CPU as the experiments they waited for
QUEUE_POLL_S = 3.0


def queue_states(repo: Path) -> list[str]:
    rows = run_cli("dvc", "queue", "status", cwd=repo).stdout.splitlines()
    return [s for line in rows for s in ("Queued", "Running", "Success", "Failed") if f" {s}" in line]


def git_head(repo: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def test_a_queued_experiment_runs_the_code_it_was_queued_with(repo):
    [base] = train_runs(repo)
    mlp = repo / "experiments/mlp.py"
    original = mlp.read_text()
    mlp.write_text(original.replace("nn.ReLU()", "nn.Tanh()"))
    # the train stage as the target: the edit reaches every stage, and the study's cells (most of
    # the work) prove nothing here
    run_cli("dvc", "exp", "run", "--queue", "-n", "tanh", "train", cwd=repo)
    mlp.write_text(original)  # the workspace goes back before the queue starts
    run_cli("dvc", "queue", "start", "-j", "1", cwd=repo)
    logs = queue_logs(repo, "tanh")
    wait_for(lambda: queue_states(repo) in (["Success"], ["Failed"]), 600, "the queue", log=logs, poll_s=QUEUE_POLL_S)
    assert queue_states(repo) == ["Success"], output_tail(logs)
    edited = next(r for r in train_runs(repo) if r.data.tags.get("dvc.exp_name") == "tanh")
    # same params and seed: only the edited model makes other weights (training is bitwise on CPU)
    assert edited.data.params == base.data.params
    assert edited.data.tags["weights.sha256"] != base.data.tags["weights.sha256"]
    diff = store(repo).download_artifacts(edited.info.run_id, "provenance/dirty.diff", str(repo.parent))
    assert "+        layers += [nn.Linear(width, hidden), nn.Tanh()" in Path(diff).read_text()


def test_a_rerun_after_a_finished_job_trains_anew_into_a_new_run(repo):
    [base] = train_runs(repo)
    # one rerun of train (the target: evaluate adds nothing here) under a new cadence, profiled
    args = ("dvc", "exp", "run", "-S", "train.log_every_steps=3", "-S", "train.profile.enabled=true", "train")

    def tidy():  # the aborted attempt's run
        for run in train_runs(repo):
            if run.info.status != "FINISHED":
                store(repo).delete_run(run.info.run_id)

    once_more_if_heap_crash(lambda: run_cli(*args, cwd=repo), tidy)
    base_run, cadence = train_runs(repo)
    profiled = cadence
    assert base_run.info.run_id == base.info.run_id
    assert cadence.info.run_id != base.info.run_id  # a new run, not the finished one "resumed"
    assert cadence.data.params["train.log_every_steps"] == "3"
    steps = [m.step for m in store(repo).get_metric_history(cadence.info.run_id, "train_loss")]
    assert steps[:3] == [3, 6, 9]  # trained from step 0 under the new cadence, not "resumed" at the end
    metrics = json.loads((repo / "results/train/metrics.json").read_text())
    assert {"samples_per_s", "step_time_ms", "ranks_in_sync", "steps"} <= set(metrics), metrics
    traces = {a.path for a in store(repo).list_artifacts(profiled.info.run_id, "profile")}
    assert {"profile/trace-rank0.json.gz", "profile/trace-rank1.json.gz"} <= traces, traces
    assert profiled.data.params["train.profile.enabled"] == "True"


def test_a_bad_key_stops_before_any_output_is_removed(repo):
    outputs = ["results/train/model.pt", "results/train/metrics.json", "results/train/run.json"]
    before = {p: (repo / p).read_bytes() for p in outputs}
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["optimzer"] = "sgd"
    write_params(repo / "params.yaml", params)
    proc = run_cli("dvc", "repro", cwd=repo, check=False)
    assert proc.returncode != 0
    ours = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("scalelab ")]
    assert len(ours) == 1 and "train.optimzer" in ours[0] and "optimizer" in ours[0], proc.stdout + proc.stderr
    assert {p: (repo / p).read_bytes() for p in outputs} == before
    status = run_cli("dvc", "status", "--json", cwd=repo).stdout
    changed = json.loads(status)
    assert set(changed) <= {"validate", "train"}, changed  # the stages that read the edited section
    assert "results/" not in status  # no output of the last good run is missing or changed


def test_a_run_started_from_another_folder_lands_in_the_repository_store(repo, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = ["--params", str(repo / "params.yaml"), "--data", str(repo / "data/prepared")]
    run_cli("train", *args, "--out", str(elsewhere / "out"), cwd=elsewhere)
    newest = train_runs(repo)[-1]
    assert newest.data.tags["git.commit"] == git_head(repo)
    assert newest.data.tags["data.path"] == "data/prepared"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["out"]  # no mlflow.db or mlruns/ here

    shutil.rmtree(repo / "data/prepared")
    proc = run_cli("reproduce", newest.info.run_id, "--yes", cwd=repo, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "data/prepared" in lines[-1] and "does not exist" in lines[-1], proc.stderr


def test_a_params_file_outside_any_repository_is_refused(tmp_path, prepared_digits):
    write_params(tmp_path / "params.yaml", tiny_params())
    args = ["--params", "params.yaml", "--data", str(prepared_digits), "--out", "out"]
    proc = run_cli("train", *args, cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "scalelab train: error: params.yaml: not inside a scalelab repository (no dvc.yaml in its folder or any "
        "folder above); the repository holds the tracking store and the code that runs"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_ctrl_c_says_interrupted_in_one_line_and_exits_130(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"].update(epochs=500, checkpoint_every_steps=20)
    write_params(repo / "params.yaml", params)
    # DVC runs a stage through $SHELL (else /bin/sh). dash, Debian's /bin/sh, does not exec the
    # command: it waits, and on SIGINT kills itself with SIGINT whatever the command exits with, so
    # DVC would report -2 for any command. bash execs it, so DVC reports scalelab's own status.
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "SHELL": "/bin/bash"}
    with open(repo.parent / "repro.log", "wb") as log:
        proc = subprocess.Popen(
            [str(BIN / "dvc"), "repro"], cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    ckpts = repo / "results/train/checkpoints"
    [base] = train_runs(repo)  # its finished job's checkpoints are there: wait for the new job's

    def new_checkpoint() -> bool:
        meta = json.loads((ckpts / "job.json").read_text()) if (ckpts / "job.json").is_file() else {}
        return meta.get("run_id") not in (None, base.info.run_id) and any(ckpts.glob("step-*"))

    log = repo.parent / "repro.log"
    try:
        wait_for(new_checkpoint, 300, "a checkpoint of the new job", proc, log=log)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        with says_why(log):
            proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    with says_why(log):
        ours = [line for line in out.splitlines() if line.startswith("scalelab ")]
        run = train_runs(repo)[-1]
        assert len(ours) == 1
        assert ours[0].startswith(f"scalelab train: interrupted: SIGINT: run {run.info.run_id} is KILLED; ")
        newest = max(int(p.stem.split("-")[1]) for p in ckpts.glob("step-*"))
        assert ours[0].endswith(f"it resumes from step {newest}")
        assert "exited with 130" in out  # DVC's own line: scalelab train's exit status
        assert "Traceback" not in out and "SignalException" not in out and "KeyboardInterrupt" not in out
        assert run.info.status == "KILLED"
