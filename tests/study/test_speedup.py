"""The speedup study on tiny sizes: outputs, skipped rows, per-cell caching, MLflow, DVC plots."""

import json
import statistics

import pandas as pd
import pytest
import yaml
from mlflow import MlflowClient

from helpers import TINY_STUDY as TINY
from helpers import kept_its_cells, ok_or_busy, run_cli, tiny_params, withheld_or, write_params

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COLUMNS = [
    "strategy",
    "world_size",
    "nodes",
    "threads_per_process",
    "samples_per_s_median",
    "samples_per_s_min",
    "samples_per_s_max",
    "step_time_ms_median",
    "train_time_s",
    "speedup",
    "efficiency",
    "predicted_efficiency",
    "status",
    "reason",
]


def cell_result(folder, name):
    """The cached result of cell `name` (`<name>-<16 hex key>.json`), read back from the cache."""
    [path] = folder.glob(f"{name}-{'?' * 16}.json")
    return json.loads(path.read_text())


def study(workdir, tracking=True, **speedup):
    write_params(workdir / "params.yaml", tiny_params(speedup={**TINY, **speedup}, tracking={"enabled": tracking}))
    return run_cli("speedup", "--out", "results/speedup", cwd=workdir)


def test_study_outputs_and_mlflow(workdir):
    study(workdir, device="cpu")
    out = workdir / "results/speedup"
    frame = pd.read_csv(out / "speedup.csv", keep_default_na=False)
    assert set(COLUMNS) <= set(frame.columns)
    by_name = frame.set_index("name")
    assert {"single-t1", "ddp-w1", "ddp-w2", "dp-w2"} <= set(by_name.index)
    dp = by_name.loc["dp-w2"]
    assert dp.status == "skipped" and "CUDA" in dp.reason and dp.samples_per_s_median == ""
    ok = frame[frame.status == "ok"]
    assert (ok.samples_per_s_min.astype(float) <= ok.samples_per_s_median.astype(float)).all()
    # speedup from the cells' own repeats in the cache, not from the report's code
    kept = kept_its_cells(frame)
    ddp = by_name.loc["ddp-w2"]
    if ddp.status == "ok" and kept:
        cell = {n: cell_result(out / "cells", n) for n in ("single-t1", "ddp-w2")}
        med = {n: statistics.median(c["samples_per_s"]) for n, c in cell.items()}
        assert float(ddp.speedup) == pytest.approx(med["ddp-w2"] / med["single-t1"])
    elif ddp.status != "ok":  # other tests slowed single-t1: faster than 2 cores allow, so no speedup is stated
        assert ddp.reason.startswith("machine busy") and ddp.speedup == "", dict(ddp)
    # fsdp at both world sizes, with memory filled: two ranks hold half of each tensor
    assert ok_or_busy(by_name.loc[["fsdp-w1", "fsdp-w2"]]), by_name.reason.to_dict()
    for name in ("fsdp-w1", "fsdp-w2"):
        assert int(by_name.loc[name, "peak_mem_bytes_per_rank"]) > 0
    assert int(by_name.loc["fsdp-w2", "param_bytes_per_rank"]) * 2 == int(by_name.loc["ddp-w2", "param_bytes_per_rank"])
    assert int(by_name.loc["fsdp-w1", "param_bytes_per_rank"]) == int(by_name.loc["ddp-w2", "param_bytes_per_rank"])
    assert by_name.loc["ddp-w2", "predicted_efficiency"] != ""

    md = (out / "speedup.md").read_text()
    assert "| setup | training time (s) | speedup |" in md
    assert "| DataParallel, 1 process x 2 GPUs | skipped: nn.DataParallel needs >= 2 CUDA devices" in md
    assert "Baseline for `speedup`: **single-t1**" in md and "Scaling mode: **weak**" in md
    assert "## Prediction (not measured)" in md
    assert (out / "speedup.png").read_bytes()[:4] == b"\x89PNG"
    head = json.loads((out / "speedup.json").read_text())
    assert withheld_or(head, "ddp_efficiency"), head  # other tests share the machine: a busy study says so
    assert "ddp_efficiency" not in head or (head["ddp_world_size"] == 2 and head["ddp_efficiency"] > 0)

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("scalelab")
    parents = client.search_runs([exp.experiment_id], "tags.`scalelab.kind` = 'study'")
    assert len(parents) == 1
    parent = parents[0]
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    skipped = set(frame.name[frame.status == "skipped"])
    assert sorted(c.info.run_name for c in children) == sorted(
        f"{n}-seed0" + (" (skipped)" if n in skipped else "") for n in frame.name
    )
    for child in children:  # a skipped cell is not a green FINISHED; a measured one spans its timed steps
        name = child.info.run_name.removesuffix(" (skipped)").removesuffix("-seed0")
        if name in skipped:
            assert child.info.status == "KILLED" and child.data.tags["scalelab.status"] == "skipped"
            continue
        assert child.info.status == "FINISHED"
        if kept:
            timed = cell_result(out / "cells", name)
            timed_ms = sum(timed["step_time_ms"]) * TINY["timed_steps"]  # every timed step, every repeat
            assert child.info.end_time - child.info.start_time >= timed_ms, (name, child.info, timed_ms)
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {
        "speedup.csv",
        "speedup.md",
        "speedup.png",
        "speedup.json",
    }
    assert ("ddp_efficiency" in parent.data.metrics) == ("ddp_efficiency" in head)
    assert parent.data.tags["scalelab.headline"] == head["headline"]


def test_changing_one_cell_reruns_only_that_cell(workdir):
    # three cells in waves of two warm cells (speedup.max_warm_cells), then the new cell alone; the
    # cache is the study's own, not MLflow's (MLflow: test_study_outputs_and_mlflow)
    cells = {"device": "cpu", "strategies": ["single", "ddp"], "tracking": False}
    first = study(workdir, world_sizes=[1], max_warm_cells=2, **cells)
    rounds = [line.split("round ")[1] for line in first.stderr.splitlines() if "round " in line]
    assert rounds[:2] == ["1: single-t1, single-t2", "2: single-t2, single-t1"], rounds
    assert "1: ddp-w1" in rounds, rounds
    kept = kept_its_cells(pd.read_csv(workdir / "results/speedup/speedup.csv"))  # else all are measured again
    second = study(workdir, world_sizes=[1, 2], **cells)
    measured = [line.split("measuring ")[1].split()[0] for line in second.stderr.splitlines() if "measuring " in line]
    if kept:  # only the changed cell (and its allreduce model) measured again
        assert measured == ["ddp-w2", "ddp-w2.allreduce"], measured
    else:
        assert "single-t1" in measured, measured
    frame = pd.read_csv(workdir / "results/speedup/speedup.csv").set_index("name")
    assert bool(frame.loc["single-t1", "cached"]) == kept and bool(frame.loc["ddp-w1", "cached"]) == kept
    assert not frame.loc["ddp-w2", "cached"]


def test_dvc_repro_speedup_and_plots(repo_copy):
    params = yaml.safe_load((repo_copy / "params.yaml").read_text())
    # fsdp's cells: test_study_outputs_and_mlflow; a busy machine keeps every repeat here
    params["speedup"].update(TINY, strategies=["single", "ddp"], max_others_cpu_share=1.0)
    params["tracking"]["enabled"] = False  # DVC's metrics and plots; MLflow: test_study_outputs_and_mlflow
    write_params(repo_copy / "params.yaml", params)
    run_cli("dvc", "repro", "speedup", cwd=repo_copy)
    written = json.loads((repo_copy / "results/speedup/speedup.json").read_text())
    assert withheld_or(written, "ddp_efficiency"), written  # a busy machine: the reason, not a number
    shown = run_cli("dvc", "metrics", "show", cwd=repo_copy).stdout
    assert ("ddp_efficiency" if "ddp_efficiency" in written else "not measured") in shown, shown
    shown = run_cli("dvc", "plots", "show", "--json", cwd=repo_copy).stdout
    assert "throughput vs workers" in shown
    assert "Data and pipelines are up to date" in run_cli("dvc", "repro", "speedup", cwd=repo_copy).stdout
