"""This process's device and threads: what the machine offers, and one setup for every rank.

`setup_process` is the one place a rank (training or a study cell) sets its torch threads,
determinism and device, and joins the process group.
"""

from __future__ import annotations

import os

import torch

from scalelab.runtime import dist


def cpu_count() -> int:
    """CPU cores this process may use (affinity-aware)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cuda_device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(kind: str) -> str:
    """'auto' -> 'cuda' when a GPU is visible, else 'cpu'; 'cpu' and 'cuda' stay as they are."""
    if kind == "auto":
        return "cuda" if cuda_device_count() > 0 else "cpu"
    return kind


def cuda_index(env: dist.DistEnv) -> int:
    """The GPU this rank drives, among those visible to it: `LOCAL_RANK` where the node's GPUs are
    all visible (torchrun), 0 where a site binds one GPU per task.

    Raises:
        RuntimeError: more than one GPU is visible, but fewer than the node's local ranks.
    """
    count = torch.cuda.device_count()
    if count == 1:
        return 0
    if env.local_world_size <= count and env.local_rank < count:
        return env.local_rank
    raise RuntimeError(
        f"local rank {env.local_rank} of {env.local_world_size} sees {count} GPUs: give each task "
        "one GPU (CUDA_VISIBLE_DEVICES) or all of the node's"
    )


def determinism(deterministic: bool, kind: str) -> None:
    """`torch.use_deterministic_algorithms`. On CUDA a nondeterministic kernel raises rather than
    warns, cuBLAS gets its fixed workspace (CUBLAS_WORKSPACE_CONFIG, read when cuBLAS starts) and
    TF32 is off for cuDNN and matmul, so a run tagged deterministic is. CPU kernels only warn."""
    if deterministic and kind == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(deterministic, warn_only=kind != "cuda")


def tf32_tags(kind: str) -> dict[str, str]:
    """Whether TF32 is on, as run tags (`scalelab.tf32.cudnn`, `scalelab.tf32.matmul`), on CUDA:
    cuDNN's default is on, matmul's off; a deterministic run turns both off (`determinism`)."""
    if kind != "cuda":
        return {}
    on = {"cudnn": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.allow_tf32}
    return {f"scalelab.tf32.{k}": str(bool(v)).lower() for k, v in on.items()}


def setup_process(
    env: dist.DistEnv, *, device: str, threads: int, deterministic: bool = False, timeout_s: float = 300.0
) -> torch.device:
    """Threads, determinism and the device of this rank; joins the process group.

    Args:
        env: this rank's place in the job (`dist.read_env()`).
        device: 'auto', 'cpu' or 'cuda'; on CUDA the rank takes GPU `cuda_index(env)`.
        threads: torch intra-op threads of this process.
        deterministic: `torch.use_deterministic_algorithms` (errors, see `determinism`).
        timeout_s: how long a collective may wait for a peer before the rank fails.

    Returns:
        The torch device of this rank.
    """
    torch.set_num_threads(threads)
    kind = resolve_device(device)
    determinism(deterministic, kind)
    where = torch.device(kind, cuda_index(env)) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(where)  # before NCCL starts: its communicator binds this device
    dist.init(env, where, timeout_s=timeout_s)
    return where
