"""The one shape check, as params validation, the SLURM pre-flight and the study use it."""

import pytest

from helpers import tiny_params, write_params
from scalelab.config import load_params
from scalelab.launch.shape import Capacity, check_shape, train_shape


def load(tmp_path, **sections):
    return load_params(write_params(tmp_path / "params.yaml", tiny_params(**sections)))


def machine(cpus: int, gpus: int = 0) -> Capacity:
    return Capacity(nodes=1, cpus_per_node=cpus, gpus_per_node=gpus, where="this machine")


def test_more_processes_than_cores_is_rejected(tmp_path):
    params = load(tmp_path, train={"nproc_per_node": 3, "device": "cpu"})
    misfit = check_shape(train_shape(params.train), machine(2))
    assert misfit.message("train") == (
        "train.nproc_per_node = 3 is not allowed: needs 3 processes of >= 1 core "
        "each per node; this machine has 2 CPU cores; use at most 2"
    )


def test_dp_without_gpus_is_rejected(tmp_path):
    params = load(tmp_path, train={"strategy": "dp"})
    assert "needs >= 2 CUDA devices" in check_shape(train_shape(params.train), machine(2)).message("train")


@pytest.mark.parametrize(
    "train, fits",
    [
        ({"nproc_per_node": 2, "threads_per_process": 1}, True),
        ({"nproc_per_node": 2, "threads_per_process": 2}, False),  # 4 threads on 2 cores
        ({"strategy": "single", "nproc_per_node": 1, "threads_per_process": 2}, True),
        ({"num_nodes": 2, "launcher": "slurm"}, False),  # one node here
    ],
)
def test_shape_fits_exactly_when_processes_and_threads_fit(tmp_path, train, fits):
    params = load(tmp_path, train={"device": "cpu", **train})
    assert (check_shape(train_shape(params.train), machine(2)) is None) == fits
