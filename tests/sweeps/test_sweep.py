"""`scalelab sweep` on the local SLURM cluster: one job array, returns at once, collect later."""

import json

import pandas as pd
import pytest
from mlflow import MlflowClient

from helpers import BIN, run_cli, says_why, slurm_logs, slurm_queued, tiny_params, wait_for, write_params

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


def test_sweep_of_four_with_one_failing_element(workdir, prepared_digits, slurm_cluster):
    (workdir / "slurm").symlink_to(BIN.parents[1] / "slurm")  # the cluster profiles
    write_params(
        workdir / "params.yaml",
        tiny_params(
            train={"launcher": "slurm", "num_nodes": 2, "nproc_per_node": 1, "optimizer": "sgd"},
            sweep={"array_parallelism": 2},
        ),
    )
    # a batch larger than the training split is refused before anything is submitted
    refused = run_cli(
        "sweep",
        "submit",
        "--name",
        "big",
        "--data",
        str(prepared_digits),
        "-S",
        "train.batch_size=16,5000",
        cwd=workdir,
        env=slurm_cluster,
        check=False,
    )
    assert refused.returncode == 2 and "train.batch_size = 5000 is too large" in refused.stderr, refused.stderr
    assert not (workdir / "results/sweeps/big/manifest.json").exists()
    # lr 1e20 (sgd) passes validation but diverges: that element fails at its first logging window
    out = run_cli(
        "sweep",
        "submit",
        "--name",
        "lr",
        "--data",
        str(prepared_digits),
        "-S",
        "train.lr=0.01,0.03,0.1,1e20",
        cwd=workdir,
        env=slurm_cluster,
    ).stdout
    assert "submitted sweep 'lr': 4 elements as job array" in out
    manifest = json.loads((workdir / "results/sweeps/lr/manifest.json").read_text())
    [array] = {e["job_id"].split("_")[0] for e in manifest["elements"]}  # one array
    # submit returned while the array was still queued or running: it does not wait for the jobs
    # (an event, not a time limit: under load the submit itself may take a minute)
    assert slurm_queued([array], slurm_cluster)
    assert not all((workdir / "results/sweeps/lr" / f"{i:03d}" / "run.json").exists() for i in range(4))

    logs = slurm_logs(workdir)  # the array elements' output
    wait_for(lambda: not slurm_queued([array], slurm_cluster), 600, "the array to end", log=logs, poll_s=2)
    summary_csv = workdir / "results/sweeps/lr/summary.csv"

    def collected() -> bool:  # one collect, unless SLURM's accounting lags behind the queue for a moment
        run_cli("sweep", "collect", "--name", "lr", cwd=workdir, env=slurm_cluster)
        return set(pd.read_csv(summary_csv, keep_default_na=False).status) <= {"finished", "failed"}

    wait_for(collected, 120, "every element's end in collect", log=[summary_csv, logs], poll_s=2)
    with says_why(logs):
        summary = pd.read_csv(summary_csv, keep_default_na=False)
        assert sorted(summary.status) == ["failed", "finished", "finished", "finished"], summary.to_string()
        failed = summary[summary.status == "failed"].iloc[0]
        assert float(failed["override.train.lr"]) == 1e20
        assert "NonFiniteLossError" in failed.error and "is not finite" in failed.error, failed.error
        finished = summary[summary.status == "finished"]
        assert (finished.test_accuracy.astype(float) > 0).all() and (finished.samples_per_s.astype(float) > 0).all()

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("scalelab")
    parents = client.search_runs([exp.experiment_id], "tags.`scalelab.kind` = 'sweep'")
    assert len(parents) == 1 and parents[0].info.run_id == manifest["parent_run_id"]
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{manifest['parent_run_id']}'")
    assert sorted(c.info.status for c in children) == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]
    assert client.get_run(manifest["parent_run_id"]).info.status == "FINISHED"
