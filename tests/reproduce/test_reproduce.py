"""`scalelab reproduce` on a pipeline run: a code diff needs --yes; a match (from a dirty tree); then a
commit this repository lacks, a diff changed in the store and altered data are each caught."""

import json
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from helpers import run_cli, tiny_params, training_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_reproduce_asks_for_yes_matches_then_refuses_a_foreign_commit_a_changed_diff_and_altered_data(repo_copy):
    training_pipeline(repo_copy, tiny_params(tracking={"system_metrics_interval_s": 0}), commit=True)
    mlp = repo_copy / "experiments/mlp.py"  # a dirty tree: the diff must travel with the run
    mlp.write_text(mlp.read_text() + "\n# an uncommitted edit\n")
    run_cli("dvc", "repro", cwd=repo_copy, timeout=900)
    run_id = json.loads((repo_copy / "results/train/run.json").read_text())["run_id"]

    client = MlflowClient(f"sqlite:///{repo_copy / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("scalelab").experiment_id
    asked = run_cli("reproduce", run_id, cwd=repo_copy, check=False, timeout=300)
    assert asked.returncode == 2, asked.stdout + asked.stderr
    assert "change code (experiments/mlp.py): read them, then pass --yes" in asked.stderr, asked.stderr
    summary = "dirty.diff: 1 file(s), +2 -0 lines (sha256 verified)\n  modified experiments/mlp.py  +2 -0  (code)"
    assert summary in asked.stdout, asked.stdout  # printed before it refused
    assert not client.search_runs([experiment], "tags.`scalelab.kind` = 'reproduce'")  # nothing ran

    out = run_cli("reproduce", run_id, "--yes", cwd=repo_copy, timeout=900).stdout
    print(out)  # the table, shown with `pytest -rP`
    assert "RESULT: match" in out and "dirty.diff" in out and summary in out, out
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    for metric in ("train_loss", "val_accuracy", "test_accuracy", "ranks_in_sync"):
        row = next(v for k, v in rows.items() if k.startswith(f"metric {metric} "))
        assert row.endswith("match"), row
    assert rows["weights sha256"].endswith("match") and "skipped" in rows["metric samples_per_s"]
    new = client.search_runs([experiment], "tags.`scalelab.kind` = 'reproduce'")
    assert len(new) == 1 and new[0].data.tags["scalelab.reproduces"] == run_id
    assert new[0].info.run_name == f"reproduce-{client.get_run(run_id).info.run_name}"
    assert new[0].data.tags["git.dirty"] == "true"  # the worktree had the diff applied
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=repo_copy, capture_output=True, text=True).stdout
    assert len(worktrees.splitlines()) == 1, worktrees  # the temporary worktree is gone

    commit = client.get_run(run_id).data.tags["git.commit"]
    client.set_tag(run_id, "git.commit", "f" * 40)  # a commit only some other clone has
    bad = run_cli("reproduce", run_id, "--yes", cwd=repo_copy, check=False, timeout=300)
    assert bad.returncode == 2 and "git pull" in bad.stderr and "fetch" not in bad.stderr, bad.stdout + bad.stderr
    client.set_tag(run_id, "git.commit", commit)
    client.set_tag(run_id, "data.path", "/etc")  # a tampered data path: outside the repository
    bad = run_cli("reproduce", run_id, "--yes", cwd=repo_copy, check=False, timeout=300)
    assert bad.returncode == 2 and "data.path = '/etc' is not allowed" in bad.stderr, bad.stdout + bad.stderr
    client.set_tag(run_id, "data.path", "data/prepared")

    stored = Path(client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / "provenance/dirty.diff"
    stored.write_text(stored.read_text().replace("# an uncommitted edit", "import os; os.system('touch pwned')"))
    bad = run_cli("reproduce", run_id, "--yes", cwd=repo_copy, check=False, timeout=300)
    assert bad.returncode == 2 and "provenance/dirty.diff has sha256" in bad.stderr, bad.stdout + bad.stderr
    assert "the stored diff was changed" in bad.stderr and "experiments/mlp.py" not in bad.stdout, bad.stdout
    assert len(client.search_runs([experiment], "tags.`scalelab.kind` = 'reproduce'")) == 1

    train_x = repo_copy / "data/prepared/train.x.npy"
    blob = train_x.read_bytes()
    train_x.unlink()  # DVC may have linked it from its cache: write a new file
    train_x.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    bad = run_cli("reproduce", run_id, cwd=repo_copy, check=False, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "RESULT: data hash mismatch" in bad.stdout and "prepared/train.x.npy sha256" in bad.stdout, bad.stdout
