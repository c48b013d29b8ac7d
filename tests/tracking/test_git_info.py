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


def test_untracked_files_are_named_not_read_unless_the_user_opts_in(tmp_path):
    from scalelab.tracking.provenance import scrub

    git(tmp_path, "init", "-q")
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    (tmp_path / "helper.py").write_text("SECRET_SAUCE = 1\n")
    (tmp_path / "dvc.lock").write_text("written by dvc\n")  # an output, never source

    tags, texts = git_info(tmp_path)
    assert "provenance/untracked.diff" not in texts and texts["provenance/untracked.txt"] == "helper.py\n"
    assert tags["git.untracked_not_stored"] == "1"
    out_tags, out_texts = scrub(tags, texts)
    assert out_tags["scalelab.reproducible"] == "false"
    assert "1 untracked file(s) are not stored" in out_tags["scalelab.not_reproducible"]
    assert "SECRET_SAUCE" not in str(out_texts)

    tags, texts = git_info(tmp_path, untracked_contents=True)
    assert (
        b"+SECRET_SAUCE = 1" in texts["provenance/untracked.diff"]
        and b"dvc.lock" not in texts["provenance/untracked.diff"]
    )
    assert scrub(tags, texts)[0]["scalelab.reproducible"] == "true"
