"""A run's name says what tells it apart: the DVC experiment's name, or for a plain `dvc repro` the
params that differ from the committed params.yaml."""

import subprocess

import yaml

from helpers import REPO
from scalelab.config import parse_params
from scalelab.training.run_record import run_name


def git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=repo, check=True)


def params_with(**train):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["train"].update(train)
    return parse_params(raw, "params.yaml")


def test_a_plain_run_is_named_by_the_params_that_differ_from_the_committed_file(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_bytes((REPO / "params.yaml").read_bytes())
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "params")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCALELAB_REPO", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    assert run_name(params_with(), 2) == "ddp-w2-fp32-seed0"  # the committed params: nothing to add
    assert run_name(params_with(lr=0.002), 2) == "ddp-w2-fp32-seed0-lr0.002"
    assert run_name(params_with(seed=3, lr=0.002), 2) == "ddp-w2-fp32-seed3-lr0.002"  # seed is in the name
    many = params_with(lr=0.002, epochs=3, batch_size=16, weight_decay=0.1)
    assert run_name(many, 2) == "ddp-w2-fp32-seed0-epochs3-batch_size16-lr0.002+1"
    monkeypatch.setenv("DVC_EXP_NAME", "lr002")
    assert run_name(params_with(lr=0.002), 2) == "ddp-w2-fp32-seed0-lr002"


def test_outside_git_a_run_keeps_the_short_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCALELAB_REPO", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    assert run_name(params_with(lr=0.002), 2) == "ddp-w2-fp32-seed0"
