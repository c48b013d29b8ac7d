"""torch.profiler around the first steps of a run: a Chrome trace per rank and op tables.

Switched on by `train.profile.enabled`. The schedule is wait/warmup/active steps; only the
active steps are recorded, so traces stay small.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from scalelab.params import ProfileConfig


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
        rows = [{"name": e.key, "count": e.count, "self_cpu_time_us": e.self_cpu_time_total,
                 "cpu_time_us": e.cpu_time_total, "device_time_us": getattr(e, "device_time_total", 0.0)}
                for e in averages]
        pd.DataFrame(rows).to_csv(self.folder / f"key_averages-rank{self.rank}.csv", index=False)


def profiler(cfg: ProfileConfig, folder: Path, rank: int) -> Any:
    """A profiler context to step once per training step, or a no-op one when disabled."""
    if not cfg.enabled:
        return nullcontext(_NoProfiler())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    return profile(activities=activities, on_trace_ready=_Export(folder, rank),
                   schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=1))


class _NoProfiler:
    def step(self) -> None: ...
