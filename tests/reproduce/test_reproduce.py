"""`scalelab reproduce` on a pipeline run: a match (from a dirty tree), then altered data is caught."""

import json
import subprocess

import pytest
from mlflow import MlflowClient

from helpers import run_cli, tiny_params, training_pipeline

pytestmark = pytest.mark.integration


def test_reproduce_matches_then_names_an_altered_data_file(repo_copy):
    training_pipeline(repo_copy, tiny_params(tracking={"system_metrics_interval_s": 0}), commit=True)
    mlp = repo_copy / "experiments/mlp.py"  # a dirty tree: the diff must travel with the run
    mlp.write_text(mlp.read_text() + "\n# an uncommitted edit\n")
    run_cli("dvc", "repro", cwd=repo_copy, timeout=900)
    run_id = json.loads((repo_copy / "results/train/run.json").read_text())["run_id"]

    out = run_cli("reproduce", run_id, cwd=repo_copy, timeout=900).stdout
    print(out)  # the table, shown with `pytest -rP`
    assert "RESULT: match" in out and "dirty.diff" in out, out
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    for metric in ("train_loss", "val_accuracy", "test_accuracy", "ranks_in_sync"):
        row = next(v for k, v in rows.items() if k.startswith(f"metric {metric} "))
        assert row.endswith("match"), row
    assert rows["weights sha256"].endswith("match") and "skipped" in rows["metric samples_per_s"]
    client = MlflowClient(f"sqlite:///{repo_copy / 'mlflow.db'}")
    new = client.search_runs(
        [client.get_experiment_by_name("scalelab").experiment_id], "tags.`scalelab.kind` = 'reproduce'"
    )
    assert len(new) == 1 and new[0].data.tags["scalelab.reproduces"] == run_id
    assert new[0].info.run_name == f"reproduce-{client.get_run(run_id).info.run_name}"
    assert new[0].data.tags["git.dirty"] == "true"  # the worktree had the diff applied
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=repo_copy, capture_output=True, text=True).stdout
    assert len(worktrees.splitlines()) == 1, worktrees  # the temporary worktree is gone

    train_pt = repo_copy / "data/prepared/train.pt"
    blob = train_pt.read_bytes()
    train_pt.unlink()  # DVC may have linked it from its cache: write a new file
    train_pt.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    bad = run_cli("reproduce", run_id, cwd=repo_copy, check=False, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "RESULT: data hash mismatch" in bad.stdout and "prepared/train.pt sha256" in bad.stdout, bad.stdout
