"""Strategy `ddp_powersgd` (DDP with torch's PowerSGD gradient-compression hook) end to end: a
study row beside ddp, and `dvc exp run -S train.strategy=ddp_powersgd` trains on 2 gloo ranks,
compressing after its first steps, with the hook's state in every checkpoint. Its resume is
bitwise (tests/training/test_strategy_registry.py, with every strategy that has parts of its own)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pandas as pd
import pytest
import torch

from helpers import run_cli, tiny_params, training_pipeline
from scalelab.config import parse_params, strategies
from scalelab.launch.shape import Capacity
from scalelab.study.plan import plan
from scalelab.study.report import _setup_label
from scalelab.training import strategy

NAME = "ddp_powersgd"


def test_the_study_plans_ddp_powersgd_as_a_row_beside_ddp():
    params = parse_params(tiny_params(speedup={"strategies": ["single", "ddp", NAME], "world_sizes": [2]}), "test")
    cells = plan(params.speedup, Capacity(nodes=1, cpus_per_node=4, gpus_per_node=0, where="this machine"))
    by_name = {c.name: c for c in cells}
    assert {"ddp-w2", f"{NAME}-w2"} <= set(by_name) and not by_name[f"{NAME}-w2"].skipped
    assert by_name[f"{NAME}-w2"].procs_per_node == by_name["ddp-w2"].procs_per_node == 2
    assert _setup_label(pd.Series(asdict(by_name[f"{NAME}-w2"]))).startswith(strategies.get(NAME).label + ", ")


def test_fp16_is_refused_before_anything_is_wrapped():
    # a GradScaler step that overflows would leave its inf in the error feedback for good
    with pytest.raises(ValueError, match=f"strategy '{NAME}' does not take precision fp16"):
        strategy.get(NAME).wrap(torch.nn.Linear(2, 2), torch.device("cpu"), precision="fp16")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.integration  # dvc exp run of validate, prepare, train and evaluate in a copy of the repo
def test_dvc_exp_run_trains_with_ddp_powersgd_and_checkpoints_the_hook_state(repo_copy):
    train = {"strategy": "ddp", "nproc_per_node": 2, "epochs": 2, "device": "cpu"}
    training_pipeline(repo_copy, tiny_params(train=train, tracking={"system_metrics_interval_s": 0}), commit=True)
    run_cli("dvc", "exp", "run", "-S", f"train.strategy={NAME}", cwd=repo_copy, timeout=900)
    summary = json.loads((repo_copy / "results/train/run.json").read_text())
    assert summary["stop_reason"] == "completed", summary
    assert len(set(summary["rank_weight_sha256"])) == 1 and len(summary["rank_weight_sha256"]) == 2  # ranks agree
    [newest, *_] = sorted((repo_copy / "results/train/checkpoints").glob("step-*.pt"), reverse=True)
    state = torch.load(newest, map_location="cpu", weights_only=True)
    hook = state["comm_hook"]  # each part under its name (training.checkpoint_parts)
    assert hook["iter"] == state["step"] > strategy.get(NAME).START_ITER  # it compressed after its start
    assert hook["q"] and len(hook["errors"]) == 2 and all(hook["errors"])  # low-rank factors and each rank's error
