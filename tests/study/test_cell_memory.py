"""What a study cell measures of memory, checked on the CPU with `torch.cuda` mocked (issue 33,
finding 9): the peak is reset once the model is wrapped (FSDP moves each unit whole to the GPU
before it shards it: that transient copy is not training's peak), and dp's peak is that of the
busiest of all the GPUs it drives, not GPU 0's alone."""

from __future__ import annotations

import types

import pytest
import torch

from helpers import tiny_params
from scalelab.config import parse_params
from scalelab.runtime import dist
from scalelab.study import cell


@pytest.fixture
def gpus(monkeypatch):
    """Mocked CUDA memory counters: `allocated` and `peak` per GPU index; returns the calls in order."""
    calls: list[tuple] = []
    state = types.SimpleNamespace(calls=calls, allocated={}, peak={})

    def allocated(d):
        calls.append(("memory_allocated", torch.device(d).index))
        return state.allocated.get(torch.device(d).index, 0)

    monkeypatch.setattr(torch.cuda, "memory_allocated", allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: state.peak.get(torch.device(d).index, 0))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: calls.append(("reset_peak", d.index)))
    return state


def built_steps(monkeypatch, gpus, strategy_name: str, world: int) -> cell.Steps:
    """`Steps.build` of a cell on cuda:0, with the workload and the wrap (build_loop) recorded, not run."""
    cfg = parse_params(tiny_params(tracking={"enabled": False}), "test").speedup
    monkeypatch.setattr(cell, "_setup", lambda spec: (cfg, dist.DistEnv(), torch.device("cuda", 0)))
    workload = types.SimpleNamespace(synthetic_batch=lambda batch, device: None)

    def load(*args, **kwargs):
        gpus.calls.append(("build_model",))
        return workload

    def build_loop(wl, device, **kwargs):
        gpus.calls.append(("wrap", kwargs["strategy_name"]))
        params = [torch.nn.Parameter(torch.zeros(2))]
        return types.SimpleNamespace(
            model=types.SimpleNamespace(parameters=lambda: params), optimizer=types.SimpleNamespace(state={})
        )

    monkeypatch.setattr(cell.workloads, "load", load)
    monkeypatch.setattr(cell, "build_loop", build_loop)
    spec = {"strategy": strategy_name, "world_size": world, "precision": "fp32", "compile": False, "batch_size": 32}
    return cell.Steps.build(spec)


def test_the_memory_baseline_comes_before_the_model_and_the_peak_is_reset_after_the_wrap(monkeypatch, gpus):
    built_steps(monkeypatch, gpus, "fsdp", 2)
    assert gpus.calls == [("memory_allocated", 0), ("build_model",), ("wrap", "fsdp"), ("reset_peak", 0)]


def test_dp_reports_the_busiest_of_all_its_gpus(monkeypatch, gpus):
    gpus.allocated = {0: 100, 1: 0}  # held before the model was built: not the cell's
    steps = built_steps(monkeypatch, gpus, "dp", 2)
    assert [c for c in gpus.calls if c[0] == "reset_peak"] == [("reset_peak", 0), ("reset_peak", 1)]
    gpus.peak = {0: 500, 1: 900}  # the replica on GPU 1 peaks higher than GPU 0
    figures = cell._memory(steps.loop, steps.devices, steps.memory_base)
    assert figures["peak_mem_bytes_per_rank"] == 900
    assert figures["peak_mem_bytes_by_device"] == [[400, 900]]
    assert figures["mem_kind"] == "cuda_max_allocated"


def test_a_one_gpu_rank_reports_its_own_gpu(monkeypatch, gpus):
    gpus.allocated = {0: 100}
    steps = built_steps(monkeypatch, gpus, "ddp", 2)
    gpus.peak = {0: 700, 1: 5000}  # another rank's GPU: not this rank's
    assert cell._memory(steps.loop, steps.devices, steps.memory_base)["peak_mem_bytes_by_device"] == [[600]]
