"""`dvc repro` in a copy of the repo (the session's shared trained_pipeline, which these tests only
read): the run carries the whole provenance bundle and seed ledger."""

import hashlib
import json
import os
import platform
import socket
import subprocess

import numpy as np
import pytest
import torch
import yaml
from mlflow import MlflowClient

from helpers import REPO
from scalelab.config import build, to_dict
from scalelab.config.schema import TrackingConfig, TrainConfig
from scalelab.runtime import seeds

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def artifact(client, run_id, name, tmp_path):
    return open(client.download_artifacts(run_id, name, str(tmp_path))).read()


@pytest.fixture(scope="module")
def trained(trained_pipeline):
    """The shared pipeline's one training run and its store (conftest.trained_pipeline)."""
    repo = trained_pipeline
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
    assert len(runs) == 1
    return repo, client, runs[0]


def test_code_provenance(trained, tmp_path):
    repo, client, run = trained
    tags = run.data.tags
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert (tags["git.commit"], tags["git.branch"], tags["git.dirty"]) == (head, "main", "true")
    assert int(tags["git.untracked"]) >= 1
    assert "+  system_metrics_interval_s: 2.0" in artifact(client, run.info.run_id, "provenance/dirty.diff", tmp_path)
    assert "+an untracked file" in artifact(client, run.info.run_id, "provenance/untracked.diff", tmp_path)


def test_data_and_params_hashes_match_dvc_lock(trained, tmp_path):
    repo, client, run = trained
    tags = run.data.tags
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    locked = {o["path"]: o["md5"] for o in lock["prepare"]["outs"]}["data/prepared"]
    assert tags["data.path"] == "data/prepared"
    assert tags["data.md5"] == tags["data.dvc_lock_md5"] == locked  # recomputed the way DVC does it
    manifest = json.loads((repo / "data/prepared/manifest.json").read_text())
    for split in ("train", "val", "test"):
        for entry in manifest["splits"][split]["arrays"].values():  # as prepare hashed them
            assert tags[f"data.sha256.{entry['file']}"] == entry["sha256"]
    assert len([k for k in tags if k.startswith("data.sha256.")]) == 7  # 6 arrays and the manifest
    files = json.loads(artifact(client, run.info.run_id, "provenance/data-files.json", tmp_path))
    assert files == {k.removeprefix("data.sha256."): v for k, v in tags.items() if k.startswith("data.sha256.")}
    consumed = lock["train"]["params"]["params.yaml"]  # the values DVC recorded for the train stage
    typed = {
        "train": to_dict(build(TrainConfig, consumed["train"], "train")),
        "tracking": to_dict(build(TrackingConfig, consumed["tracking"], "tracking")),
    }
    canonical = json.dumps(typed, sort_keys=True, default=str).encode()  # derived here, not by provenance
    assert tags["params.sha256"] == hashlib.sha256(canonical).hexdigest()
    assert "stages:" in artifact(client, run.info.run_id, "provenance/dvc.lock", tmp_path)


def test_environment_hosts_and_launcher(trained, tmp_path):
    repo, client, run = trained
    tags, host = run.data.tags, socket.gethostname()
    assert tags["env.python"] == platform.python_version() and tags["env.torch"] == torch.__version__
    if torch.cuda.is_available():
        assert "none" not in (tags["env.cuda"], tags["env.cudnn"], tags["env.nccl"], tags["env.gpus"])
    else:
        assert (tags["env.cuda"], tags["env.cudnn"], tags["env.nccl"]) == ("none", "none", "none")
        assert tags["env.gpus"] == f"{host}: none"
    assert tags["env.hosts"] == host and tags["env.num_nodes"] == "1"
    assert tags["env.cpu"] and tags["env.cpu_cores"] == str(os.cpu_count())
    freeze = artifact(client, run.info.run_id, "provenance/pip-freeze.txt", tmp_path)
    assert f"torch=={torch.__version__}" in freeze and "mlflow==" in freeze
    assert tags["launch.kind"] == "torchrun" and tags["launch.torchelastic_run_id"]
    assert (tags["launch.restart_count"], tags["launch.nnodes"], tags["launch.world_size"]) == ("0", "1", "2")
    assert "train-worker --resolved" in tags["launch.command"]
    assert tags["launch.user_command"].endswith(
        "scalelab train --params params.yaml --data data/prepared --out results/train"
    )
    assert f"system/{host}/cpu_utilization_percentage" in run.data.metrics  # system metrics, by node
    run_file = json.loads((repo / "results/train/run.json").read_text())
    assert tags["weights.sha256"] == run_file["rank_weight_sha256"][0] and tags["weights.ranks_in_sync"] == "true"


def test_seed_ledger_as_artifact_and_params(trained, tmp_path):
    repo, client, run = trained
    ledger = json.loads(artifact(client, run.info.run_id, "seeds.json", tmp_path))
    assert ledger["base_seed"] == 0 and ledger["model_init_seed"] == 0
    # the documented rule (README, runtime/seeds.py), computed here with numpy, not by scalelab
    rank_seeds = {str(r): int(np.random.SeedSequence(0, spawn_key=(r,)).generate_state(1)[0]) for r in (0, 1)}
    assert ledger["rank_seeds"] == rank_seeds  # one entry per rank
    assert ledger["worker_seed_rule"] == seeds.WORKER_RULE and ledger["rank_seed_rule"] == seeds.RANK_RULE
    assert ledger["deterministic_algorithms"] is True and ledger["num_workers"] == 0
    params = run.data.params
    assert {k for k in params if k.startswith("seed.rank.")} == {"seed.rank.0", "seed.rank.1"}
    assert params["seed.rank.1"] == str(rank_seeds["1"]) and params["seed.base"] == "0"
    assert params["seed.worker_rule"] == seeds.WORKER_RULE and params["seed.deterministic"] == "True"
    config = json.loads(artifact(client, run.info.run_id, "config.json", tmp_path))
    default = yaml.safe_load((REPO / "params.yaml").read_text())["train"]
    assert config["train"]["epochs"] == default["epochs"] and config["train"]["seed"] == 0
