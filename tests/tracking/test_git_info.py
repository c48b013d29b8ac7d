"""The recorded source of a run: what DVC writes during `dvc repro` (dvc.lock, stage outputs and the
committed metrics files) is an output of the run, never part of its diff or its dirty flag."""

import subprocess

from scalelab.tracking.provenance import git_info

DVC_YAML = """stages:
  train:
    cmd: python train.py
    outs:
      - results/model.pt
      - results/run.json:
          cache: false
    metrics:
      - results/metrics.json:
          cache: false
"""


def git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_what_dvc_writes_is_not_source_but_a_code_edit_is(tmp_path):
    git(tmp_path, "init", "-q")
    files = {"dvc.yaml": DVC_YAML, "dvc.lock": "a\n", "results/metrics.json": "{}\n", "train.py": "x = 1\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")

    (tmp_path / "dvc.lock").write_text("b\n")  # DVC mid-repro: the lock updated, the metrics removed
    (tmp_path / "results/metrics.json").unlink()
    tags, diffs = git_info(tmp_path)
    assert tags["git.dirty"] == "false" and "provenance/dirty.diff" not in diffs, diffs

    (tmp_path / "train.py").write_text("x = 2\n")
    tags, diffs = git_info(tmp_path)
    assert tags["git.dirty"] == "true"
    assert b"+x = 2" in diffs["provenance/dirty.diff"] and b"dvc.lock" not in diffs["provenance/dirty.diff"]
