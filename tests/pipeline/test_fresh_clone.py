"""DVC's conventions hold in a fresh clone: dvc.lock and the metrics files are committed, so
`dvc exp show` and `dvc metrics diff` read the committed baseline's figures with no DVC cache or
remote (the README says to commit them after each `dvc repro` that is kept)."""

import json
import subprocess

import pytest
import yaml

from helpers import REPO, run_cli

pytestmark = pytest.mark.integration

METRICS = ("results/train/metrics.json", "results/eval/metrics.json", "results/speedup/speedup.json")


def committed(path: str) -> dict:
    shown = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=REPO, capture_output=True, text=True)
    assert shown.returncode == 0, f"{path} is not committed: {shown.stderr.strip()}"
    return json.loads(shown.stdout)


def test_dvc_lock_and_the_metrics_files_are_committed():
    lock = yaml.safe_load(subprocess.run(["git", "show", "HEAD:dvc.lock"], cwd=REPO, capture_output=True).stdout)
    assert lock and set(lock["stages"]) == {"validate", "prepare", "train", "evaluate", "speedup"}
    assert committed("results/eval/metrics.json")["test_accuracy"] >= 0.95  # the default pipeline's figure


def test_a_fresh_clone_shows_the_committed_figures(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    rows = json.loads(run_cli("dvc", "exp", "show", "--json", cwd=clone).stdout)
    [head] = [row for row in rows if row["rev"] != "workspace"]
    metrics = head["data"]["metrics"]
    for path in METRICS:
        assert "error" not in metrics[path], metrics[path]
        assert metrics[path]["data"] == committed(path), path
    diff = run_cli("dvc", "metrics", "diff", "--json", cwd=clone)
    assert json.loads(diff.stdout) == {}  # the workspace holds the committed figures: nothing changed
