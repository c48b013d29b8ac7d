"""Sweeps live in the workspace's results/sweeps (runtime.paths: never the current directory by
accident), whichever folder `scalelab sweep` runs from."""

import json

from scalelab.runtime.paths import REPO_ENV
from scalelab.sweeps import sweep


def test_a_sweep_is_found_in_the_workspace_from_any_working_folder(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "experiments").mkdir(parents=True)
    (repo / "dvc.yaml").write_text("stages: {}\n")
    manifest = {"name": "lr", "parent_run_id": "run", "elements": []}
    (repo / "results/sweeps/lr").mkdir(parents=True)
    (repo / "results/sweeps/lr/manifest.json").write_text(json.dumps(manifest))
    monkeypatch.delenv(REPO_ENV, raising=False)
    monkeypatch.chdir(repo / "experiments")  # a folder inside the workspace
    assert sweep._manifest("lr") == manifest
    monkeypatch.chdir(tmp_path)  # outside it: the workspace a command found from its params file
    monkeypatch.setenv(REPO_ENV, str(repo))
    assert sweep._manifest("lr") == manifest
    assert sweep.sweeps_root() == repo / "results/sweeps"
