"""The measured cells as one table (speedup.csv): throughput, speedups with bootstrap intervals,
compile cost, memory per rank.

Every speedup is against a *seed* baseline: the single process at the same batch size, in fp32
and eager (compile off). So a bf16 DDP cell's speedup holds both effects, and "does bf16 or compile
buy more than a second worker?" is read off one column. For the default grid (one batch, fp32, no
compile) the figures are those of the study before it had these axes.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np
import pandas as pd

from scalelab.config import SpeedupConfig, strategies
from scalelab.study import busy, comm_model
from scalelab.study.bootstrap import ratio_of_medians as bootstrap_ratio  # the speedups' intervals

COLUMNS = [
    "name",
    "strategy",
    "world_size",
    "nodes",
    "threads_per_process",
    "device",
    "precision",
    "compile",
    "activation_checkpointing",
    "batch_size",
    "global_batch",
    "samples_per_s_median",
    "samples_per_s_min",
    "samples_per_s_max",
    "step_time_ms_median",
    "step_time_ms_min",
    "step_time_ms_max",
    "train_time_s",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "speedup_vs_single_t1",
    "speedup_vs_single_t1_ci_low",
    "speedup_vs_single_t1_ci_high",
    "speedup_vs_single_all",
    "speedup_vs_single_all_ci_low",
    "speedup_vs_single_all_ci_high",
    "efficiency",
    "efficiency_ci_low",
    "efficiency_ci_high",
    "efficiency_vs_same_threads",
    "predicted_efficiency",
    "noisy",
    "others_cpu_share_max",
    "repeats_kept",
    "repeats_dropped",
    "dropped_why",
    "compile_s",
    "break_even_steps",
    "peak_mem_bytes_per_rank",
    "param_bytes_per_rank",
    "grad_bytes_per_rank",
    "optim_bytes_per_rank",
    "mem_kind",
    "status",
    "reason",
    "cached",
]
MEMORY = ["peak_mem_bytes_per_rank", "param_bytes_per_rank", "grad_bytes_per_rank", "optim_bytes_per_rank"]
NOISY_SPREAD = 0.10  # (max - min) / median of a cell's per-repeat samples/s above this: noisy
# a cell faster than its single-process twin by more than the ratio of the cores (or devices) they
# used, plus this margin, was not measured fairly: other load slowed the twin, not the cell
BUSY_MARGIN = 0.10
SPEEDUP_COLUMNS = [c for c in COLUMNS if c.startswith(("speedup", "efficiency"))]
NAN = float("nan")


def measured_singles(frame: pd.DataFrame) -> pd.DataFrame:
    """The measured single-process rows, fewest threads (the 1-thread baseline) first."""
    return frame[(frame.strategy == strategies.baseline().name) & (frame.status == "ok")].sort_values(
        "threads_per_process"
    )


def seed_singles(frame: pd.DataFrame, batch_size: int) -> pd.DataFrame:
    """The seed baselines at one batch: measured single-process rows in fp32, eager; fewest threads first."""
    singles = measured_singles(frame)
    return singles[
        (singles.batch_size == batch_size)
        & (singles.precision == "fp32")
        & ~singles["compile"].astype(bool)
        & ~singles["activation_checkpointing"].astype(bool)
    ]


def reference(cfg: SpeedupConfig, frame: pd.DataFrame) -> pd.DataFrame:
    """The rows at the reference axes (the first batch size, precision and compile setting)."""
    at = (
        (frame.batch_size == cfg.batch_sizes[0])
        & (frame.precision == cfg.precisions[0])
        & (frame["compile"].astype(bool) == cfg.compile[0])
        & (frame["activation_checkpointing"].astype(bool) == cfg.activation_checkpointing[0])
    )
    return frame[at]


def grad_bytes_of(results: dict[str, dict]) -> int:
    """The model's gradient size, from any measured cell."""
    return next((r["grad_bytes"] for r in results.values() if r["status"] == "ok"), 0)


def repeats_of(results: dict[str, dict]) -> dict[str, np.ndarray]:
    """Per-repeat samples/s of every measured cell."""
    return {n: np.asarray(r["samples_per_s"], dtype=float) for n, r in results.items() if r["status"] == "ok"}


def is_noisy(value: Any) -> bool:
    """The `noisy` column's value as a bool (it is empty for a cell that was not measured)."""
    return isinstance(value, (bool, np.bool_)) and bool(value)


def spread(samples: list[float]) -> float:
    """(max - min) / median: how far a cell's repeats disagree."""
    return (max(samples) - min(samples)) / statistics.median(samples)


def _row(cfg: SpeedupConfig, cell: Any, res: dict[str, Any]) -> dict[str, Any]:
    row = {
        "name": cell.name,
        "strategy": cell.strategy,
        "world_size": cell.world_size,
        "nodes": cell.nodes,
        "threads_per_process": cell.threads_per_process,
        "device": cell.device,
        "precision": cell.precision,
        "compile": bool(cell.compile),
        "activation_checkpointing": bool(cell.activation_checkpointing),
        "batch_size": cell.batch_size,
        "status": res["status"],
        "reason": res.get("reason", ""),
        "cached": res.get("cached", False),
        **_repeats(res),
    }
    if res["status"] != "ok":
        return row
    sps, step = res["samples_per_s"], res["step_time_ms"]
    compile_s = res.get("compile_s")
    row.update(
        global_batch=res["global_batch"],
        samples_per_s_median=statistics.median(sps),
        samples_per_s_min=min(sps),
        samples_per_s_max=max(sps),
        step_time_ms_median=statistics.median(step),
        step_time_ms_min=min(step),
        step_time_ms_max=max(step),
        train_time_s=cfg.work_samples / statistics.median(sps),
        noisy=bool(spread(sps) > NOISY_SPREAD),
        compile_s=NAN if compile_s is None else float(compile_s),
        mem_kind=res.get("mem_kind", ""),
        **{k: NAN if res.get(k) is None else float(res[k]) for k in MEMORY},
    )
    return row


def _repeats(res: dict[str, Any]) -> dict[str, Any]:
    """How many repeats were kept and dropped (busy: study.busy), and what others took at most."""
    if res["status"] not in ("ok", "invalid"):
        return {}
    dropped = res.get("dropped") or []
    taken = [*(res.get("disturbance") or []), *dropped]
    return {
        "repeats_kept": len(res.get("samples_per_s") or []),
        "repeats_dropped": len(dropped),
        "dropped_why": busy.dropped_summary(dropped),
        "others_cpu_share_max": max((d["others_cpu_share"] for d in taken), default=NAN),
    }


def table(cfg: SpeedupConfig, cells: list, results: dict[str, dict], link: comm_model.Link | None) -> pd.DataFrame:
    """One row per cell; speedups against both seed baselines at the cell's batch size."""
    frame = pd.DataFrame([_row(cfg, cell, results[cell.name]) for cell in cells]).reindex(columns=COLUMNS)
    frame["compile"] = frame["compile"].astype(bool)
    frame["activation_checkpointing"] = frame["activation_checkpointing"].astype(bool)
    frame["noisy"] = frame["noisy"].astype(object)
    reps = repeats_of(results)
    for label, pick in (("single_t1", 0), ("single_all", -1)):
        base = [_baseline(frame, row.batch_size, pick) for _, row in frame.iterrows()]
        col = f"speedup_vs_{label}"
        frame[col] = [
            r.samples_per_s_median / b.samples_per_s_median if b is not None else NAN
            for (_, r), b in zip(frame.iterrows(), base)
        ]
        bounds = [_ci(reps, r, b) for (_, r), b in zip(frame.iterrows(), base)]
        frame[f"{col}_ci_low"], frame[f"{col}_ci_high"] = [b[0] for b in bounds], [b[1] for b in bounds]
    chosen = f"speedup_vs_{cfg.baseline.replace('-', '_')}"
    for end in ("", "_ci_low", "_ci_high"):
        frame[f"speedup{end}"] = frame[chosen + end]
        frame[f"efficiency{end}"] = frame[f"speedup{end}"] / frame.world_size
    frame["efficiency_vs_same_threads"] = [_same_threads_efficiency(frame, row) for _, row in frame.iterrows()]
    frame["compile_s"] = [net_compile_s(frame, row, results) for _, row in frame.iterrows()]
    frame["break_even_steps"] = [break_even(frame, row) for _, row in frame.iterrows()]
    grad_bytes = grad_bytes_of(results)
    frame["predicted_efficiency"] = [_predicted(cfg, frame, row, link, grad_bytes) for _, row in frame.iterrows()]
    return invalidate_impossible(frame)


def resources(row: pd.Series) -> int:
    """What a cell computes on: devices on CUDA, cores (processes x threads) on a CPU."""
    return int(row.world_size) * (1 if row.device == "cuda" else int(row.threads_per_process))


def impossible(frame: pd.DataFrame, row: pd.Series) -> str | None:
    """Why `row`'s throughput cannot be true against the fewest-thread single process measured at
    its batch, precision, compile and activation-checkpointing setting (its twin), or None."""
    singles = measured_singles(frame)
    twins = singles[
        (singles.batch_size == row.batch_size)
        & (singles.precision == row.precision)
        & (singles["compile"].astype(bool) == bool(row["compile"]))
        & (singles["activation_checkpointing"].astype(bool) == bool(row["activation_checkpointing"]))
    ]
    if row.status != "ok" or twins.empty or twins.iloc[0]["name"] == row["name"]:
        return None
    twin = twins.iloc[0]
    ratio = resources(row) / resources(twin)
    speedup = row.samples_per_s_median / twin.samples_per_s_median
    if speedup <= (1 + BUSY_MARGIN) * ratio:
        return None
    return (
        f"machine busy: faster than {ratio:g}x the cores or devices of {twin['name']} allow (over "
        f"{(1 + BUSY_MARGIN) * ratio:.2f}x its throughput); rerun on an idle machine"
    )


def invalidate_impossible(frame: pd.DataFrame) -> pd.DataFrame:
    """Cells whose speedup cannot be true become status `invalid` with the reason, and no speedup or
    efficiency figure: the report, the headline, the answers and the runs state none for them."""
    reasons = [impossible(frame, row) for _, row in frame.iterrows()]
    bad = np.array([r is not None for r in reasons])
    if bad.any():
        frame.loc[bad, "status"] = "invalid"
        frame.loc[bad, "reason"] = [r for r in reasons if r is not None]
        frame.loc[bad, SPEEDUP_COLUMNS] = NAN
    return frame


def _baseline(frame: pd.DataFrame, batch_size: int, pick: int) -> pd.Series | None:
    singles = seed_singles(frame, batch_size)
    return singles.iloc[pick] if len(singles) else None


def _ci(reps: dict[str, np.ndarray], row: pd.Series, base: pd.Series | None) -> tuple[float, float]:
    if base is None or row["name"] not in reps:
        return NAN, NAN
    return bootstrap_ratio(reps[row["name"]], reps[base["name"]])


def same_threads_single(frame: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The seed single process with this row's threads per process, at its batch size."""
    singles = seed_singles(frame, row.batch_size)
    same = singles[singles.threads_per_process == row.threads_per_process]
    return same.iloc[0] if len(same) else None


def _same_threads_efficiency(frame: pd.DataFrame, row: pd.Series) -> float:
    """Throughput / (world x the single process with the same threads): like for like per rank."""
    if row.status != "ok":
        return NAN
    same = same_threads_single(frame, row)
    return NAN if same is None else row.samples_per_s_median / (row.world_size * same.samples_per_s_median)


def eager_twin(frame: pd.DataFrame, row: pd.Series) -> pd.Series | None:
    """The measured cell that is `row` but eager (compile off), or None."""
    twin = frame[
        (frame.status == "ok")
        & ~frame["compile"]
        & (frame.strategy == row.strategy)
        & (frame.world_size == row.world_size)
        & (frame.nodes == row.nodes)
        & (frame.threads_per_process == row.threads_per_process)
        & (frame.precision == row.precision)
        & (frame.batch_size == row.batch_size)
        & (frame["activation_checkpointing"] == row["activation_checkpointing"])
    ]
    return None if twin.empty else twin.iloc[0]


def net_compile_s(frame: pd.DataFrame, row: pd.Series, results: dict[str, dict]) -> float:
    """A compiled cell's compile time: its first step's excess over its median step (the cell's
    `compile_s`) less its eager twin's, which every first step pays without compiling (DDP's
    buckets, lazy kernel loading, the allocator's first blocks). Without a measured twin, the
    excess alone (an upper bound)."""
    if row.status != "ok" or not row["compile"] or row.compile_s != row.compile_s:
        return row.compile_s
    twin = eager_twin(frame, row)
    first = results.get(twin["name"], {}).get("first_step_s") if twin is not None else None
    return row.compile_s if first is None else row.compile_s - (first - twin.step_time_ms_median / 1000.0)


def break_even(frame: pd.DataFrame, row: pd.Series) -> float:
    """Steps after which a compiled cell has paid back its compile time against the same cell eager;
    NaN when it is not compiled, has no measured eager twin, or is not faster."""
    if row.status != "ok" or not row["compile"] or row.compile_s != row.compile_s:
        return NAN
    twin = eager_twin(frame, row)
    if twin is None:
        return NAN
    saved_s = (twin.step_time_ms_median - row.step_time_ms_median) / 1000.0
    return row.compile_s / saved_s if saved_s > 0 else NAN


def _predicted(
    cfg: SpeedupConfig, frame: pd.DataFrame, row: pd.Series, link: comm_model.Link | None, grad_bytes: float
) -> float:
    """Model efficiency of a measured ddp row, from the seed single process with the same threads."""
    singles = seed_singles(frame, row.batch_size)
    if not strategies.get(row.strategy).reference or row.status != "ok" or link is None or singles.empty:
        return NAN
    same = same_threads_single(frame, row)
    compute_1_s = (same if same is not None else singles.iloc[0]).step_time_ms_median / 1000.0
    if cfg.scaling == "weak":
        return comm_model.efficiency(compute_1_s, row.world_size, grad_bytes, link)
    return comm_model.strong_efficiency(compute_1_s, row.world_size, grad_bytes, link)


def predictions(cfg: SpeedupConfig, frame: pd.DataFrame, grad_bytes: float) -> pd.DataFrame:
    """Predicted efficiency at large world sizes under the named interconnect presets."""
    singles = seed_singles(frame, cfg.batch_sizes[0])
    if singles.empty:
        return pd.DataFrame()
    compute_1_s = singles.iloc[0].step_time_ms_median / 1000.0
    model = comm_model.efficiency if cfg.scaling == "weak" else comm_model.strong_efficiency
    rows = []
    for name, ic in cfg.interconnects.items():
        link = comm_model.Link(ic.bandwidth_gb_s * 1e9, ic.latency_us * 1e-6)
        for world in cfg.predict_world_sizes:
            rows.append(
                {
                    "interconnect": name,
                    "bandwidth_gb_s": ic.bandwidth_gb_s,
                    "latency_us": ic.latency_us,
                    "world_size": world,
                    "allreduce_ms": 1000 * link.allreduce_s(world, grad_bytes),
                    "predicted_efficiency": model(compute_1_s, world, grad_bytes, link),
                }
            )
    return pd.DataFrame(rows)
