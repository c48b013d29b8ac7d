"""`scalelab bench dvc` on a two-stage toy pipeline: timings, the stages that ran, the summary lines."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import BIN
from scalelab.bench import dvc_repro, stats
from scalelab.cli import main

pytestmark = pytest.mark.integration
WRITE = f"{sys.executable} -c \"import sys; open(sys.argv[1], 'w').write('x')\""


def toy_repo(root: Path, stage_that_also_reads_the_param: str | None = None, guard: bool = False) -> Path:
    """prepare -> evaluate; `evaluate.batch_size` is evaluate's param (and optionally another's);
    with `guard`, a validate stage of the whole params file first."""
    stages = {
        "prepare": {"cmd": f"{WRITE} a.txt", "params": ["prepare.n"], "outs": ["a.txt"]},
        "evaluate": {"cmd": f"{WRITE} b.txt", "deps": ["a.txt"], "params": ["evaluate.batch_size"], "outs": ["b.txt"]},
    }
    if stage_that_also_reads_the_param:
        stages[stage_that_also_reads_the_param]["params"].append("evaluate.batch_size")
    if guard:  # as dvc.yaml's validate: the whole params file, its output the same for every valid file
        check = f"{sys.executable} -c \"import sys; open(sys.argv[1], 'w').write('valid')\" ok.txt"
        stages = {"validate": {"cmd": check, "params": [{"params.yaml": None}], "outs": ["ok.txt"]}, **stages}
        stages["prepare"]["deps"] = ["ok.txt"]
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    (root / "params.yaml").write_text(yaml.safe_dump({"prepare": {"n": 1}, "evaluate": {"batch_size": 512}}))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@e"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "toy"], cwd=root, check=True)
    return root


def _bench(workdir: Path, repo: Path) -> dict:
    argv = ["bench", "dvc", "--out", str(workdir / "bench"), "--repo", str(repo), "--repeats", "2"]
    assert main([*argv, "--incremental-repeats", "1", "--set", "prepare.n=2", "--max-busy-share", "1"]) == 0
    return json.loads((workdir / "bench/dvc.json").read_text())


def test_dvc_benchmark_times_noop_and_one_param_change_that_reruns_only_evaluate(workdir, capsys):
    result = _bench(workdir, toy_repo(workdir / "toy"))
    assert "- dvc_noop: no-op dvc repro " in capsys.readouterr().out and result["benchmark"] == "dvc"
    assert result["first_repro"]["stages"] == ["prepare", "evaluate"]
    noop_s = [r["wall_s"] for r in result["noop"]]
    assert len(noop_s) == 2 and result["noop_ran_nothing"] and result["noop_median_s"] > 0
    assert result["incremental"][0]["stages"] == ["evaluate"] and result["incremental"][0]["value"] == 256
    assert result["incremental_only_stage"] is True and result["overrides"] == ["prepare.n=2"]
    assert result["noop_median_s"] == statistics.median(noop_s)
    lines = stats.read_summary(workdir / "bench")
    assert lines["dvc_incremental"].endswith("goal reruns only evaluate (and validate): met")
    assert lines["dvc_noop"].endswith(
        "nothing rerun: met" if statistics.median(noop_s) <= 2.0 else "nothing rerun: not met"
    )
    assert not (workdir / "toy/dvc.lock").exists()  # measured in a copy, the repo untouched


def test_a_param_change_that_reruns_another_stage_is_not_met(workdir):
    result = _bench(workdir, toy_repo(workdir / "toy", stage_that_also_reads_the_param="prepare"))
    assert result["incremental"][0]["stages"] == ["prepare", "evaluate"]
    assert result["incremental_only_stage"] is False
    assert stats.read_summary(workdir / "bench")["dvc_incremental"].endswith(": not met")


def test_the_params_check_every_edit_reruns_is_not_counted_against_the_goal(workdir):
    result = _bench(workdir, toy_repo(workdir / "toy", guard=True))
    assert result["incremental"][0]["stages"] == ["validate", "evaluate"]  # validate's output unchanged: no prepare
    assert result["incremental_only_stage"] is True
    assert "stages run: evaluate, validate" in stats.read_summary(workdir / "bench")["dvc_incremental"]


def test_the_default_overrides_are_valid_params():
    from helpers import REPO
    from scalelab.bench import pipeline

    pipeline.params_tree(REPO / "params.yaml", dvc_repro.DEFAULT_SETS)
