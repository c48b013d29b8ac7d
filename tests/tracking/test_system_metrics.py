"""System metrics from every node: two torchrun 'nodes' on this host, one MLflow run, two labels."""

import os
import subprocess
import sys

import pytest
from mlflow import MlflowClient

from helpers import free_port, log_of, says_why, tiny_params, write_params
from scalelab.config import load_params
from scalelab.data.store import verify
from scalelab.training.plan import RunPlan, write_resolved

pytestmark = pytest.mark.distributed


@pytest.mark.slow  # two torchrun "nodes" sampling for seconds
def test_every_node_logs_its_system_metrics_into_rank_zeros_run(workdir, prepared_digits):
    params = load_params(
        write_params(
            workdir / "params.yaml",
            tiny_params(
                train={"nproc_per_node": 1, "num_nodes": 2, "launcher": "slurm", "epochs": 1},
                tracking={"system_metrics_interval_s": 1},
            ),
        )
    )
    train_samples = verify(prepared_digits)["splits"]["train"]["num_samples"]
    resolved = write_resolved(workdir / "results/train", params, RunPlan.of(params.train, train_samples))
    port = free_port()
    procs = []
    for node in (0, 1):  # MLFLOW_SYSTEM_METRICS_NODE_ID stands in for two host names
        env = {
            **os.environ,
            "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}",
            "OMP_NUM_THREADS": "1",
            "MLFLOW_SYSTEM_METRICS_NODE_ID": f"node{node}",
        }
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--node-rank={node}",
            "--nproc-per-node=1",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "-m",
            "scalelab.cli",
            "train-worker",
            "--resolved",
            str(resolved),
            "--data",
            str(prepared_digits),
            "--out",
            "results/train",
        ]
        procs.append(
            subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)

    with says_why([log_of(f"node {i}'s output", lambda o=o: o) for i, o in enumerate(outputs)]):
        client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
        runs = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
        assert len(runs) == 1  # only global rank 0 creates a run
        run = runs[0]
        assert run.info.status == "FINISHED" and run.data.tags["launch.nnodes"] == "2"
        for node in ("node0", "node1"):
            for name in ("cpu_utilization_percentage", "system_memory_usage_megabytes"):
                assert f"system/{node}/{name}" in run.data.metrics, sorted(run.data.metrics)
