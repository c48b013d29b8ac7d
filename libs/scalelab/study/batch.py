"""Batch size against workers (speedup_batch.csv, speedup_crossover.csv): at which batch does DDP
at N workers beat the best single process?

Small batches leave little compute per step to hide the gradient all-reduce behind, so DDP loses
to one process that uses all cores; as the batch grows, compute grows and the all-reduce does
not. The crossover is given as measured (the bracketing pair of measured batches) and as predicted
by the ring all-reduce model (comm_model) added to a linear fit of single-process step time.
All rows are fp32 and eager: the batch axis alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from scalelab.config import SpeedupConfig, strategies
from scalelab.study import comm_model
from scalelab.study.measured import NAN, bootstrap_ratio, repeats_of

BATCH_COLUMNS = [
    "name",
    "strategy",
    "world_size",
    "nodes",
    "threads_per_process",
    "batch_size",
    "global_batch",
    "samples_per_s_median",
    "best_single",
    "best_single_samples_per_s",
    "speedup_vs_best_single",
    "speedup_ci_low",
    "speedup_ci_high",
    "same_threads_single",
    "efficiency",
    "efficiency_ci_low",
    "efficiency_ci_high",
    "noisy",
]
CROSSOVER_COLUMNS = [
    "world_size",
    "nodes",
    "measured_lose_batch",
    "measured_win_batch",
    "measured",
    "predicted_batch",
    "predicted",
]
NEEDS_TWO = "needs >= 2 batch sizes"


def eager_fp32(frame: pd.DataFrame) -> pd.DataFrame:
    eager = ~frame["compile"].astype(bool) & ~frame["activation_checkpointing"].astype(bool)
    return frame[(frame.status == "ok") & (frame.precision == "fp32") & eager]


def best_single(frame: pd.DataFrame, batch_size: int) -> pd.Series | None:
    """The fastest fp32 eager single process (single-t1 or single-all) at one batch."""
    singles = eager_fp32(frame)
    singles = singles[(singles.strategy == strategies.baseline().name) & (singles.batch_size == batch_size)]
    return singles.loc[singles.samples_per_s_median.idxmax()] if len(singles) else None


def batch_table(frame: pd.DataFrame, results: dict[str, dict]) -> pd.DataFrame:
    """One row per fp32 eager ddp/fsdp cell: speedup vs the best single process at its batch and
    efficiency vs world x the single process with the same threads per process."""
    reps = repeats_of(results)
    ok = eager_fp32(frame)
    rows = []
    distributed = [name for name, s in strategies.STRATEGIES.items() if s.distributed]
    for _, row in ok[ok.strategy.isin(distributed)].iterrows():
        best = best_single(frame, row.batch_size)
        same = ok[
            (ok.strategy == strategies.baseline().name)
            & (ok.batch_size == row.batch_size)
            & (ok.threads_per_process == row.threads_per_process)
        ]
        same = same.iloc[0] if len(same) else None
        speed_ci = bootstrap_ratio(reps[row["name"]], reps[best["name"]]) if best is not None else (NAN, NAN)
        eff_ci = bootstrap_ratio(reps[row["name"]], reps[same["name"]]) if same is not None else (NAN, NAN)
        rows.append(
            {
                **{k: row[k] for k in ("name", "strategy", "world_size", "nodes", "threads_per_process")},
                **{k: row[k] for k in ("batch_size", "global_batch", "samples_per_s_median", "noisy")},
                "best_single": best["name"] if best is not None else "",
                "best_single_samples_per_s": best.samples_per_s_median if best is not None else NAN,
                "speedup_vs_best_single": row.samples_per_s_median / best.samples_per_s_median
                if best is not None
                else NAN,
                "speedup_ci_low": speed_ci[0],
                "speedup_ci_high": speed_ci[1],
                "same_threads_single": same["name"] if same is not None else "",
                "efficiency": row.samples_per_s_median / (row.world_size * same.samples_per_s_median)
                if same is not None
                else NAN,
                "efficiency_ci_low": eff_ci[0] / row.world_size,
                "efficiency_ci_high": eff_ci[1] / row.world_size,
            }
        )
    table = pd.DataFrame(rows).reindex(columns=BATCH_COLUMNS)
    return table.sort_values(["strategy", "world_size", "nodes", "batch_size"], kind="stable").reset_index(drop=True)


def measured_crossover(ddp: pd.DataFrame) -> dict[str, Any]:
    """The bracketing pair from one world size's rows (batch_size, speedup_vs_best_single)."""
    rows = ddp.dropna(subset=["speedup_vs_best_single"]).sort_values("batch_size")
    if rows.batch_size.nunique() < 2:
        return {"measured_lose_batch": NAN, "measured_win_batch": NAN, "measured": NEEDS_TWO}
    wins = rows[rows.speedup_vs_best_single > 1.0]
    if wins.empty:
        top = int(rows.batch_size.max())
        text = f"not reached in the measured range (loses up to batch {top})"
        return {"measured_lose_batch": top, "measured_win_batch": NAN, "measured": text}
    win = int(wins.batch_size.iloc[0])
    lose = rows[(rows.batch_size < win) & (rows.speedup_vs_best_single <= 1.0)]
    if lose.empty:
        return {"measured_lose_batch": NAN, "measured_win_batch": win, "measured": f"at or below batch {win}"}
    low = int(lose.batch_size.iloc[-1])
    return {"measured_lose_batch": low, "measured_win_batch": win, "measured": f"between batch {low} and {win}"}


def fit_line(batches: list[float], times_s: list[float]) -> tuple[float, float]:
    """Least-squares step time = a + c * batch; returns (a, c)."""
    c, a = np.polyfit(np.asarray(batches, dtype=float), np.asarray(times_s, dtype=float), 1)
    return float(a), float(c)


def predicted_crossover(
    world: int, rank_fit: tuple[float, float], single_fits: dict[str, tuple[float, float]], allreduce_s: float
) -> tuple[float, str]:
    """Smallest per-rank batch b with N*b / (t_rank(b) + allreduce) > b / t_s(b) for every single s.

    With t(b) = a + c*b the condition for one single is b * (N*c_s - c_rank) > a_rank + allreduce - N*a_s.
    Returns (batch, text); batch is NaN when no batch wins.
    """
    a_r, c_r = rank_fit
    need = 1.0
    for name, (a_s, c_s) in single_fits.items():
        gain, cost = world * c_s - c_r, a_r + allreduce_s - world * a_s
        if gain > 0:
            need = max(need, math.floor(cost / gain) + 1)
        elif cost >= 0:
            return NAN, f"not predicted at any batch: {name}'s per-sample time beats {world} ranks'"
    return float(need), f"from batch {int(need)}"


def crossover(
    cfg: SpeedupConfig, frame: pd.DataFrame, batch: pd.DataFrame, link: comm_model.Link | None, grad_bytes: float
) -> pd.DataFrame:
    """Per ddp world size > 1: the crossover batch, measured and predicted."""
    rows = []
    ddp = batch[(batch.strategy == strategies.reference().name) & (batch.world_size > 1)]
    for (world, nodes), group in ddp.groupby(["world_size", "nodes"]):
        row = {"world_size": int(world), "nodes": int(nodes), **measured_crossover(group)}
        row["predicted_batch"], row["predicted"] = _prediction(cfg, frame, group, link, grad_bytes)
        rows.append(row)
    return pd.DataFrame(rows).reindex(columns=CROSSOVER_COLUMNS)


def _prediction(
    cfg: SpeedupConfig, frame: pd.DataFrame, group: pd.DataFrame, link: comm_model.Link | None, grad_bytes: float
) -> tuple[float, str]:
    singles = eager_fp32(frame)
    singles = singles[singles.strategy == strategies.baseline().name]
    if link is None:
        return NAN, "no prediction: no fitted link (the all-reduce benchmark did not run)"
    if singles.batch_size.nunique() < 2:
        return NAN, f"no prediction: {NEEDS_TWO}"
    if cfg.scaling != "weak":
        return NAN, "no prediction: the model is for weak scaling (per-rank batch)"
    # one fit per single-process setup (its threads), across the measured batches
    fits = {
        _label(g): fit_line(list(g.batch_size), list(g.step_time_ms_median / 1000.0))
        for _, g in singles.groupby("threads_per_process")
        if g.batch_size.nunique() >= 2
    }
    # one rank computes like the single process with the same threads (else the fewest threads)
    threads = int(group.threads_per_process.iloc[0])
    same = singles[singles.threads_per_process == threads]
    rank = _label(same if len(same) else singles[singles.threads_per_process == singles.threads_per_process.min()])
    if rank not in fits:
        return NAN, f"no prediction: {rank} has fewer than 2 batch sizes"
    world = int(group.world_size.iloc[0])
    return predicted_crossover(world, fits[rank], fits, link.allreduce_s(world, grad_bytes))


def _label(singles: pd.DataFrame) -> str:
    """The name of a single-process setup's rows at their smallest batch (single-t1, not single-t1-b64)."""
    return str(singles.sort_values("batch_size")["name"].iloc[0])
