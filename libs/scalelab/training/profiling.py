"""torch.profiler around the first steps of a run: a Chrome trace per rank and op tables.

Switched on by `train.profile.enabled`. The schedule is wait/warmup/active steps; only the
active steps are recorded, so traces stay small. Each rank writes `trace-rank{r}.json.gz` (Chrome
trace, open it in chrome://tracing or Perfetto) and `key_averages-rank{r}.txt` / `.csv` into
`<out>/profile` (a shared folder on multi-node jobs). Rank 0 clears that folder before the first
step, so files of an earlier run are never logged, and at the end logs exactly this job's files as
MLflow artifacts under `profile/`, with their sizes: the metric `profile_trace_bytes` (all ranks)
and the tags `profile.trace_bytes.rank{r}`.
"""

from __future__ import annotations

import logging
import shutil
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from scalelab.config.schema import ProfileConfig

log = logging.getLogger(__name__)


class _Export:
    """on_trace_ready: writes trace-rank{r}.json.gz and key_averages as text and csv."""

    def __init__(self, folder: Path, rank: int) -> None:
        self.folder, self.rank = folder, rank

    def __call__(self, prof: Any) -> None:
        import pandas as pd

        self.folder.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.folder / f"trace-rank{self.rank}.json.gz"))
        averages = prof.key_averages()
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        (self.folder / f"key_averages-rank{self.rank}.txt").write_text(averages.table(sort_by=sort, row_limit=40))
        rows = [
            {
                "name": e.key,
                "count": e.count,
                "self_cpu_time_us": e.self_cpu_time_total,
                "cpu_time_us": e.cpu_time_total,
                "device_time_us": getattr(e, "device_time_total", 0.0),
            }
            for e in averages
        ]
        pd.DataFrame(rows).to_csv(self.folder / f"key_averages-rank{self.rank}.csv", index=False)


def profiler(cfg: ProfileConfig, folder: Path, rank: int) -> Any:
    """A profiler context to step once per training step, or a no-op one when disabled."""
    if not cfg.enabled:
        return nullcontext(_NoProfiler())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    return profile(
        activities=activities,
        on_trace_ready=_Export(folder, rank),
        schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=1),
    )


class _NoProfiler:
    def step(self) -> None: ...


def rank_files(rank: int) -> list[str]:
    """The files rank `rank` writes: its trace and its key_averages table (text and csv)."""
    return [f"trace-rank{rank}.json.gz", f"key_averages-rank{rank}.txt", f"key_averages-rank{rank}.csv"]


def clear(folder: Path) -> None:
    """Removes files of an earlier run (call on global rank 0 before the first step)."""
    shutil.rmtree(folder, ignore_errors=True)


def log_artifacts(tracker: Any, folder: Path, world_size: int, step: int) -> dict[str, int]:
    """Logs every rank's profiler files under `profile/` and their sizes; returns trace bytes.

    A rank whose files are missing (fewer steps than wait + warmup + active) is named in a warning.
    """
    sizes = {}
    for rank in range(world_size):
        paths = [folder / name for name in rank_files(rank)]
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            log.warning("profiler files missing for rank %d: %s", rank, ", ".join(missing))
        for path in paths:
            if path.is_file():
                tracker.log_artifact(path, "profile")
        if paths[0].is_file():
            sizes[rank] = paths[0].stat().st_size
    if sizes:
        tracker.set_tags({f"profile.trace_bytes.rank{r}": n for r, n in sizes.items()})
        tracker.log_metrics({"profile_trace_bytes": float(sum(sizes.values()))}, step)
    return sizes
