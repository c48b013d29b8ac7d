"""The committed dvc.lock matches the tree: every code folder a stage depends on hashes to what
dvc.lock records, and every param a stage reads has the value dvc.lock records, so a fresh clone's
`dvc status` reports only missing outputs, and `dvc exp show`'s `main` row is HEAD's figures.
Hashes only, no stage runs. After a change to code or params.yaml: `make dvc-lock` (it reruns what
changed), then commit dvc.lock with the metrics files."""

from __future__ import annotations

import subprocess

import yaml

from helpers import REPO
from scalelab.runtime.paths import CODE_ROOTS
from scalelab.tracking.provenance import dvc_dir_md5, file_hashes

FIX = "run `make dvc-lock` and commit dvc.lock with the metrics files"


def tracked_hashes(folder: str) -> dict[str, tuple[str, str]]:
    """`file_hashes` of the folder's files that git tracks (what a fresh clone holds), as DVC sees
    them (.dvcignore leaves out __pycache__/)."""
    listed = subprocess.run(["git", "ls-files", "--", folder], cwd=REPO, capture_output=True, text=True).stdout.split()
    hashes = file_hashes(REPO / folder)
    tracked = {p.removeprefix(folder.rstrip("/") + "/") for p in listed}
    return {rel: h for rel, h in hashes.items() if rel in tracked}


def test_every_code_dependency_in_dvc_lock_matches_the_tree():
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    stale = []
    for stage, body in lock.items():
        for dep in body.get("deps") or []:
            if not dep["path"].startswith(CODE_ROOTS):
                continue
            now = dvc_dir_md5(tracked_hashes(dep["path"]))
            if now != dep["md5"]:
                stale.append(f"{stage}: {dep['path']} is {now} in the tree, {dep['md5']} in dvc.lock")
    assert not stale, f"dvc.lock is stale ({FIX}):\n" + "\n".join(stale)


def test_every_param_in_dvc_lock_matches_params_yaml():
    from scalelab.config import flatten

    lock = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    params = flatten(yaml.safe_load((REPO / "params.yaml").read_text()))
    stale = []
    for stage, body in lock.items():
        listed = (body.get("params") or {}).get("params.yaml") or {}  # sections and keys, as dvc.yaml lists them
        recorded = flatten(listed)
        for key in sorted(set(recorded) | {k for k in params if any(k.startswith(f"{r}.") for r in listed)}):
            if params.get(key) != recorded.get(key):
                stale.append(f"{stage}: {key} = {params.get(key)!r} in params.yaml, {recorded.get(key)!r} in dvc.lock")
    assert not stale, f"dvc.lock is stale ({FIX}):\n" + "\n".join(stale)


def test_the_lock_and_dvc_yaml_name_the_same_stages():
    lock = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert set(lock) == set(stages), FIX
