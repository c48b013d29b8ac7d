"""Every CUDA path, checked on the CPU (issue 33): `torch.cuda` and `torch.accelerator` are mocked
where a call would need a GPU, each mock standing in for what torch 2.13's own function does.

What only a real GPU shows (kernel speed, NCCL itself, memory figures) is not checked here.
"""

from __future__ import annotations

import contextlib
import os
import types

import pytest
import torch
from torch import nn

from helpers import tiny_params
from scalelab.config import ConfigError, SpeedupConfig, build, parse_params
from scalelab.launch import slurm
from scalelab.launch.shape import Capacity, JobShape, check_shape
from scalelab.reproduce import compare
from scalelab.runtime import device as device_mod
from scalelab.runtime import dist, seeds
from scalelab.study.plan import plan
from scalelab.sweeps import search as search_mod
from scalelab.sweeps.manifest import Search
from scalelab.training import strategy, submit


@pytest.fixture
def fake_cuda(monkeypatch):
    """`count` visible GPUs as torch.cuda and torch.accelerator report them; returns the calls."""
    calls: list[tuple] = []

    def install(count: int) -> list[tuple]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", torch.device(d))))
        # parallel_apply's replica threads: a stream and a device guard per GPU
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a: torch.device("cuda"))
        monkeypatch.setattr(torch.accelerator, "current_stream", lambda *a: contextlib.nullcontext())
        monkeypatch.setattr(torch.accelerator, "device_index", lambda *a: contextlib.nullcontext())
        return calls

    return install


@pytest.fixture
def dp_init(monkeypatch):
    """nn.DataParallel's constructor, recording its device_ids (the real one probes the GPUs)."""
    seen: dict = {}

    def init(self, module, device_ids=None, output_device=None, dim=0):
        nn.Module.__init__(self)
        self.module, self.dim = module, dim
        seen["device_ids"] = device_ids
        self.device_ids = list(device_ids) if device_ids is not None else list(range(torch.cuda.device_count()))
        self.output_device = self.device_ids[0]
        self.src_device_obj = torch.device("cuda", self.device_ids[0])

    monkeypatch.setattr(nn.DataParallel, "__init__", init)
    return seen


@pytest.fixture
def torch_globals():
    """setup_process sets process-wide torch state: put it back."""
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    warn = torch.is_deterministic_algorithms_warn_only_enabled()
    tf32 = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(det, warn_only=warn)
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


def test_dp_drives_the_jobs_gpus_and_does_not_wrap_on_cpu(fake_cuda, dp_init):
    fake_cuda(8)
    model = nn.Identity()  # no parameters: .to("cuda:0") moves nothing
    wrapped = strategy.get("dp").wrap(model, torch.device("cuda", 0), num_devices=2)
    assert dp_init["device_ids"] == [0, 1]  # not all 8 visible GPUs
    assert isinstance(wrapped, nn.DataParallel)
    plain = nn.Linear(2, 2)
    assert strategy.get("dp").wrap(plain, torch.device("cpu")) is plain


def test_a_dp_replica_thread_under_bf16_autocast_computes_bf16(fake_cuda, dp_init):
    fake_cuda(2)
    dp = strategy.get("dp").wrap(nn.Identity(), torch.device("cuda", 0), num_devices=2)

    class Seen(nn.Module):
        def forward(self, x):
            self.dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
            return x

    replicas = [Seen(), Seen()]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        dp.parallel_apply(replicas, [(torch.ones(1),), (torch.ones(1),)], [{}, {}])  # two threads
    assert [r.dtype for r in replicas] == [torch.bfloat16, torch.bfloat16]


def _record_nccl(monkeypatch, calls: list, env: dist.DistEnv) -> None:
    monkeypatch.setattr(dist.tdist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist.tdist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    monkeypatch.setattr(dist.tdist, "get_rank", lambda: env.rank)
    monkeypatch.setattr(dist.tdist, "get_world_size", lambda: env.world_size)


@pytest.mark.parametrize(("visible", "expect"), [(8, 3), (1, 0)])
def test_nccl_binds_the_ranks_gpu_after_set_device(fake_cuda, monkeypatch, torch_globals, visible, expect):
    calls = fake_cuda(visible)  # 8: torchrun shows the node's GPUs; 1: the site binds one per task
    env = dist.DistEnv(rank=3, local_rank=3, world_size=8, local_world_size=8)
    _record_nccl(monkeypatch, calls, env)
    where = device_mod.setup_process(env, device="cuda", threads=1)
    assert where == torch.device("cuda", expect)
    assert calls[0] == ("set_device", where)  # first: NCCL's communicator binds the current device
    backend, kw = calls[1]
    assert backend == "nccl" and kw["device_id"] == where


def test_deterministic_cuda_raises_on_nondeterministic_kernels(fake_cuda, monkeypatch, torch_globals):
    fake_cuda(1)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "unset")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    asked = []
    monkeypatch.setattr(
        torch, "use_deterministic_algorithms", lambda on, warn_only=False: asked.append((on, warn_only))
    )
    device_mod.setup_process(dist.DistEnv(), device="cuda", threads=1, deterministic=True)
    assert asked == [(True, False)]
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32


def _run(device: str | None, sha: str) -> types.SimpleNamespace:
    tags = {"weights.sha256": sha} | ({"scalelab.device": device} if device else {})
    return types.SimpleNamespace(data=types.SimpleNamespace(tags=tags))


@pytest.mark.parametrize(("old", "new"), [("cpu", "cuda"), ("cuda", "cpu"), ("cuda", "cuda")])
def test_reproduce_uses_tolerance_when_either_run_is_cuda(old, new):
    assert compare.on_gpu(_run(old, "a"), _run(new, "b"))
    assert not compare.on_gpu(_run("cpu", "a"), _run("cpu", "b"))


def test_fsdp_bf16_gathers_bf16_parameters_and_reduces_fp32(monkeypatch):
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp

    policies = []
    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda *a, **k: "mesh")
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(fsdp, "fully_shard", lambda m, **kw: policies.append(kw.get("mp_policy")) or m)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    strategy.get("fsdp").wrap(model, torch.device("cpu"), lambda m: list(m), precision="bf16")
    assert len(policies) == 3  # two units, then the root
    assert all(p.param_dtype == torch.bfloat16 and p.reduce_dtype == torch.float32 for p in policies)


def test_rng_restore_with_fewer_gpus_than_were_saved(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    set_on = []

    def set_rng_state(state, device="cuda"):
        index = torch.device(device).index if not isinstance(device, int) else device
        if (index or 0) >= torch.cuda.device_count():
            raise IndexError(f"no GPU {index}: {torch.cuda.device_count()} visible")
        set_on.append(index or 0)

    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)  # set_rng_state_all's
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.zeros(8, dtype=torch.uint8))
    state = seeds.rng_state()
    assert state["cuda_device"].numel() == 8  # this rank's GPU, not every visible one
    saved_on_8 = {k: v for k, v in state.items() if k != "cuda_device"} | {"cuda": [torch.zeros(8)] * 8}
    seeds.set_rng_state(saved_on_8)  # an older checkpoint, written where 8 GPUs were visible
    seeds.set_rng_state(state)
    assert set_on == [0, 0]


def _executor_args(monkeypatch, **train) -> dict:
    got = {}
    monkeypatch.setattr(slurm, "executor", lambda params, profile, name, **kw: got.update(kw))
    params = parse_params(tiny_params(train={"launcher": "slurm", **train}), "test")
    profile = slurm.Profile(cpus_per_node=64, gpus_per_node=8)
    slurm.train_executor(params, profile, "job")
    return got


def test_dp_on_slurm_asks_one_task_and_n_gpus_and_each_gpu_task_gets_its_cpus(monkeypatch):
    dp = _executor_args(monkeypatch, strategy="dp", nproc_per_node=4, device="cuda")
    assert (dp["tasks_per_node"], dp["gpus_per_node"], dp["cpus_per_task"]) == (1, 4, 32)
    ddp = _executor_args(monkeypatch, strategy="ddp", nproc_per_node=8, device="cuda")
    assert (ddp["tasks_per_node"], ddp["gpus_per_node"], ddp["cpus_per_task"]) == (8, 8, 8)


def test_each_local_sweep_worker_gets_its_own_gpus(fake_cuda, monkeypatch, tmp_path):
    fake_cuda(4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    envs = []

    class Proc:
        def __init__(self, cmd, env=None):
            envs.append((env or {}).get("CUDA_VISIBLE_DEVICES"))

        def wait(self):
            return 0

    monkeypatch.setattr(search_mod.subprocess, "Popen", Proc)
    monkeypatch.setattr(search_mod, "collect", lambda s: None)
    raw = tiny_params(train={"strategy": "ddp", "nproc_per_node": 2, "device": "auto"})
    fields = dict(method="grid", trials=2, metric="val_loss", mode="min", pruner="none", space=[], storage="")
    fields |= dict(data="", launcher="local", heartbeat_s=60.0, seed=0)
    search = Search(name="s", folder=str(tmp_path), parallel=2, raw=raw, **fields)
    assert search_mod.run_local(search) == 0
    assert envs == ["0,1", "2,3"]
    with pytest.raises(ConfigError, match=r"sweep.parallel = 3 .* need 6 GPUs; this machine has 4"):
        search_mod.worker_gpus(parse_params(raw, "test").train, 3, ["0", "1", "2", "3"])


@pytest.mark.parametrize(
    ("train", "says"),
    [
        ({"strategy": "dp", "nproc_per_node": 2, "device": "cpu"}, r"train.device = 'cpu' is not allowed"),
        (
            {"strategy": "dp", "nproc_per_node": 2, "activation_checkpointing": True},
            r"train.activation_checkpointing = true is not allowed",
        ),
    ],
)
def test_dp_refuses_cpu_and_activation_checkpointing_before_it_starts(train, says):
    with pytest.raises(ConfigError, match=says):
        parse_params(tiny_params(train=train), "params.yaml")


def test_a_local_rank_destroys_its_process_group(monkeypatch):
    ended = []
    monkeypatch.setattr(submit, "raise_on_sigterm", lambda: None)
    monkeypatch.setattr(submit.lifeline, "exit_with_torchrun", lambda: None)
    monkeypatch.setattr(submit, "read_resolved", lambda path: (None, None))
    monkeypatch.setattr(submit.job, "run", lambda *a, **k: {"done": True})
    monkeypatch.setattr(submit.dist, "shutdown", lambda: ended.append(True))
    assert submit.run_worker("resolved.json", "data", "out") == {"done": True}
    assert ended == [True]


def test_fsdp_shards_before_anything_goes_to_the_gpu(monkeypatch):
    """The whole model on the GPU before sharding would put an unsharded copy in fsdp's peak."""
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp

    events = []
    monkeypatch.setattr(device_mesh, "init_device_mesh", lambda *a, **k: "mesh")
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(fsdp, "fully_shard", lambda m, **kw: events.append("shard") or m)
    model = nn.Sequential(nn.Linear(2, 2))
    monkeypatch.setattr(model, "to", lambda *a, **k: events.append("whole model to the GPU") or model)
    strategy.get("fsdp").wrap(model, torch.device("cuda", 0), lambda m: list(m))
    assert events == ["shard", "shard"]  # fully_shard moves each unit to the mesh's device itself


def test_a_cuda_run_records_whether_tf32_is_on(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    tags = device_mod.tf32_tags("cuda")
    assert tags == {"scalelab.tf32.cudnn": "true", "scalelab.tf32.matmul": "false"}
    assert device_mod.tf32_tags("cpu") == {}


def _study(**speedup) -> SpeedupConfig:
    return build(SpeedupConfig, {**tiny_params()["speedup"], "device": "cuda", **speedup}, "speedup")


def test_the_study_on_one_gpu_shows_dp_as_skipped_rather_than_dropping_it():
    cells = plan(
        _study(strategies=["single", "dp"], world_sizes="auto"),
        Capacity(nodes=1, cpus_per_node=16, gpus_per_node=1, where="this machine"),
    )
    dp = [c for c in cells if c.strategy == "dp"]
    assert [c.name for c in dp] == ["dp-w2"] and "nn.DataParallel needs >= 2 CUDA devices" in dp[0].reason


def test_the_study_skips_dp_with_activation_checkpointing_and_dp_on_a_gpu_nodes_cpu():
    cfg = _study(strategies=["dp"], world_sizes=[2], activation_checkpointing=[False, True])
    cells = {
        c.name: c.reason for c in plan(cfg, Capacity(nodes=1, cpus_per_node=16, gpus_per_node=2, where="this machine"))
    }
    assert cells["dp-w2"] == "" and "replica threads would share" in cells["dp-w2-ac"]
    on_cpu = check_shape(
        JobShape(strategy="dp", device="cpu", procs_per_node=2),
        Capacity(nodes=1, cpus_per_node=16, gpus_per_node=8, where="a node"),
    )
    assert on_cpu and "runs on CUDA devices only" in on_cpu.message("train")


def test_ranks_that_would_share_a_gpu_fail_with_why(fake_cuda):
    fake_cuda(2)
    env = dist.DistEnv(rank=1, local_rank=1, world_size=4, local_world_size=4)
    with pytest.raises(RuntimeError, match="local rank 1 of 4 sees 2 GPUs"):
        device_mod.cuda_index(env)
