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


def setup_process(
    env: dist.DistEnv, *, device: str, threads: int, deterministic: bool = False, timeout_s: float = 300.0
) -> torch.device:
    """Threads, determinism and the device of this rank; joins the process group.

    Args:
        env: this rank's place in the job (`dist.read_env()`).
        device: 'auto', 'cpu' or 'cuda'; on CUDA the rank takes GPU `env.local_rank`.
        threads: torch intra-op threads of this process.
        deterministic: `torch.use_deterministic_algorithms` (warn-only).
        timeout_s: how long a collective may wait for a peer before the rank fails.

    Returns:
        The torch device of this rank.
    """
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    kind = resolve_device(device)
    where = torch.device(kind, env.local_rank) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":
        torch.cuda.set_device(where)
    dist.init(env, kind, timeout_s=timeout_s)
    return where
