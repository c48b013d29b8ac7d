"""The SLURM pre-flight: each refusal the README lists, before anything is submitted; and the rendezvous
port a SLURM task exports."""

import dataclasses
import os

import pytest

from helpers import free_port, run_cli, tiny_params, write_params
from scalelab.config import ConfigError, load_params
from scalelab.launch import slurm

PROFILE = slurm.Profile(
    max_nodes=2, cpus_per_node=2, time_limit_min=30, signal_delay_s=60, login_node_is_compute_host=True
)


def params(tmp_path, **train):
    return load_params(write_params(tmp_path / "p.yaml", tiny_params(train={"launcher": "slurm", **train})))


@pytest.mark.parametrize(
    "train, profile, needle",
    [
        ({"num_nodes": 3}, {}, "train.num_nodes = 3 is not allowed: needs 3 nodes; profile 'local' has 2"),
        ({"nproc_per_node": 3}, {}, "train.nproc_per_node = 3 is not allowed: needs 3 processes"),
        (
            {"nproc_per_node": 2, "threads_per_process": 2},
            {},
            "train.threads_per_process = 2 is not allowed: 2 threads",
        ),
        ({"device": "cuda"}, {}, "train.device = 'cuda' is not allowed: needs a CUDA device; profile 'local' has none"),
        ({}, {"signal": "USR1"}, "signal = 'USR1' conflicts with NCCL"),
        ({"checkpoint_every_steps": 2000}, {}, "no checkpoint would land"),
    ],
)
def test_preflight_refuses_a_job_the_cluster_cannot_run(tmp_path, train, profile, needle):
    with pytest.raises(ConfigError) as exc:
        slurm.preflight(params(tmp_path, **train), dataclasses.replace(PROFILE, **profile), "sqlite:////tmp/x.db")
    assert needle in str(exc.value)


def test_preflight_refuses_a_store_the_compute_nodes_cannot_reach(tmp_path):
    p = params(tmp_path)
    with pytest.raises(ConfigError, match="is not under the shared paths"):
        slurm.preflight(p, dataclasses.replace(PROFILE, shared_paths=["/shared"]), "sqlite:////tmp/mlflow.db")
    with pytest.raises(ConfigError, match="points at loopback"):
        slurm.preflight(p, dataclasses.replace(PROFILE, login_node_is_compute_host=False), "http://127.0.0.1:5000")
    with pytest.raises(ConfigError, match="does not answer"):  # nothing listens there
        slurm.preflight(p, PROFILE, f"http://127.0.0.1:{free_port()}")


@pytest.mark.integration  # `scalelab train`, in a process of its own
def test_a_refused_job_exits_2_before_anything_is_submitted(workdir, prepared_digits):
    (workdir / "slurm/profiles").mkdir(parents=True)
    (workdir / "slurm/profiles/usr1.yaml").write_text(
        "partition: debug\nmax_nodes: 2\ncpus_per_node: 2\nsignal: USR1\nlogin_node_is_compute_host: true\n"
    )
    write_params(workdir / "params.yaml", tiny_params(train={"launcher": "slurm"}, slurm={"profile": "usr1"}))
    proc = run_cli("train", "--data", str(prepared_digits), "--out", "out", cwd=workdir, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("scalelab train: error:") and "conflicts with NCCL" in lines[-1]
    assert "Traceback" not in proc.stderr
    assert not (workdir / "results/slurm").exists() and not (workdir / "mlflow.db").exists()
    assert not (workdir / "out/slurm.json").exists()  # no job id: nothing was submitted


def test_error_messages_mask_the_credentials_of_the_store(tmp_path):
    with pytest.raises(ConfigError) as exc:
        slurm.preflight(params(tmp_path), PROFILE, f"http://alice:hunter2@127.0.0.1:{free_port()}")
    assert "hunter2" not in str(exc.value) and "alice:***@" in str(exc.value)


@pytest.mark.parametrize("where", ["env", "local file"])
def test_an_unreachable_store_is_named_where_it_was_set(tmp_path, monkeypatch, where):
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # the main repository: home of .scalelab.local.yaml
    if where == "env":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        named = f"MLFLOW_TRACKING_URI = '{uri}' does not answer"
    else:
        (tmp_path / ".scalelab.local.yaml").write_text(f"tracking_uri: {uri}\n")
        named = f"tracking_uri in {tmp_path / '.scalelab.local.yaml'} = '{uri}' does not answer"
    with pytest.raises(ConfigError) as exc:
        slurm.preflight(params(tmp_path), PROFILE, uri)
    assert named in str(exc.value)


def test_a_jobs_rendezvous_port_is_below_the_ephemeral_ports_and_apart_from_its_neighbours():
    low = 32768  # Linux's default ip_local_port_range starts here; submitit drew job 22's port, 49908, above it
    ports = [slurm.rendezvous_port(job_id) for job_id in range(1, 5001)]
    assert all(1024 <= port < low for port in ports) and len(set(ports)) == len(ports)


TASK_ENV = {"SLURM_JOB_ID": "22", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1"}
TASK_ENV |= {"SLURM_JOB_NODELIST": "n[0-1]", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SUBMITIT_EXECUTOR": "slurm"}
EXPORTED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.mark.parametrize("submitted_from_torchrun", [False, True])
def test_a_slurm_task_exports_its_ranks_and_the_jobs_port(monkeypatch, submitted_from_torchrun):
    for key in EXPORTED:  # export_rank_env sets them: setenv first, so that undo removes them again
        monkeypatch.setenv(key, "unset")
        monkeypatch.delenv(key)
    for key, value in TASK_ENV.items():
        monkeypatch.setenv(key, value)
    if submitted_from_torchrun:  # sbatch passes the submitting shell's on: the task's own replace them
        for key, value in {"MASTER_ADDR": "elsewhere", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "4"}.items():
            monkeypatch.setenv(key, value)
    slurm.export_rank_env()
    assert {k: os.environ[k] for k in EXPORTED} == {
        "MASTER_ADDR": "n0", "MASTER_PORT": str(slurm.rendezvous_port(22)),
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
    }  # fmt: skip
