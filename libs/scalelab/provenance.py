"""Provenance: what code, data, environment and launcher produced a run.

`collect()` returns flat tags (for filtering in the UI) plus larger texts logged as artifacts
(the dirty diff and `pip freeze`).
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

LAUNCH_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NODELIST",
               "SLURM_RESTART_COUNT", "SLURM_NNODES", "TORCHELASTIC_RUN_ID")


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def git_info(root: Path) -> tuple[dict[str, str], str]:
    """Tags for commit, branch and dirty flag, and the dirty diff (against HEAD)."""
    commit = (_git(root, "rev-parse", "HEAD") or "unknown").strip()
    branch = (_git(root, "rev-parse", "--abbrev-ref", "HEAD") or "unknown").strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    diff = _git(root, "diff", "HEAD", "--binary") or ""
    dirty = "unknown" if status is None else str(bool(status.strip())).lower()
    return {"git.commit": commit, "git.branch": branch, "git.dirty": dirty,
            "mlflow.source.git.commit": commit}, diff


def dvc_lock_hashes(root: Path) -> dict[str, str]:
    """md5 of each dependency and output recorded in dvc.lock (data and params consumed)."""
    lock = root / "dvc.lock"
    if not lock.is_file():
        return {}
    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
    hashes = {}
    for stage, body in stages.items():
        for entry in (body.get("deps") or []) + (body.get("outs") or []):
            if "md5" in entry:
                hashes[f"dvc.{stage}.{entry['path']}"] = entry["md5"]
    return hashes


def environment() -> dict[str, str]:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "host": socket.gethostname(),
            "platform": platform.platform(), "cpu": _cpu_model(), "cpu_cores": str(os.cpu_count())}
    if torch.cuda.is_available():
        info["cudnn"] = str(torch.backends.cudnn.version())
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        info["gpus"] = "; ".join(f"{p.name} {p.total_memory // 2**20} MiB" for p in props)
    return {f"env.{k}": v for k, v in info.items()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def launcher_info() -> dict[str, str]:
    info = {f"launch.{k.lower()}": os.environ[k] for k in LAUNCH_VARS if k in os.environ}
    info["launch.kind"] = "slurm" if "SLURM_JOB_ID" in os.environ else (
        "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "process")
    info["launch.command"] = " ".join(sys.argv)[:5000]
    return info


def pip_freeze() -> str:
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    return "\n".join(dists) + "\n"


def collect(root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Returns (tags, artifacts): flat string tags and {artifact name: text}."""
    git_tags, diff = git_info(root)
    tags = {**git_tags, **dvc_lock_hashes(root), **environment(), **launcher_info()}
    artifacts = {"provenance/pip-freeze.txt": pip_freeze()}
    if diff:
        artifacts["provenance/dirty.diff"] = diff
    return tags, artifacts
