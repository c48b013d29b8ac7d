"""The one place that reads the distributed environment, with a single-process fallback.

torchrun and submitit's TorchDistributedEnvironment both export RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Without them, this is a single process.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist


@dataclass(frozen=True, slots=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1 or "RANK" in os.environ

    @property
    def is_main(self) -> bool:
        """Global rank 0: the only process that writes shared files and talks to MLflow."""
        return self.rank == 0


def read_env() -> DistEnv:
    if "RANK" not in os.environ:
        return DistEnv()
    return DistEnv(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
    )


def init(env: DistEnv, device: torch.device, timeout_s: float = 300.0) -> None:
    """Joins the process group (gloo on CPU, NCCL on CUDA) and checks it against the env.

    On CUDA the group is bound to this rank's `device` (`device_id`): NCCL then knows its GPU
    without guessing from the current device at each barrier.
    """
    if not env.is_distributed or tdist.is_initialized():
        return
    timeout = datetime.timedelta(seconds=timeout_s)
    if device.type == "cuda":
        tdist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        tdist.init_process_group("gloo", timeout=timeout)
    if (tdist.get_rank(), tdist.get_world_size()) != (env.rank, env.world_size):
        raise RuntimeError(
            f"process group says rank {tdist.get_rank()}/{tdist.get_world_size()}, "
            f"the environment says {env.rank}/{env.world_size}"
        )


def shutdown() -> None:
    if tdist.is_initialized():
        tdist.destroy_process_group()


def barrier() -> None:
    if tdist.is_initialized():
        tdist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    if not tdist.is_initialized():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    if not tdist.is_initialized():
        return [obj]
    out: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if tdist.is_initialized():
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t


def any_rank(flag: bool, device: str) -> bool:
    """True on every rank when `flag` is true on any rank (one small all-reduce)."""
    if not tdist.is_initialized():
        return flag
    return bool(all_reduce_sum(torch.tensor([int(flag)], device=device)).item())
