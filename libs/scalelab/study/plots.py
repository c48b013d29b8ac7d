"""The study's figures: speedup.png (workers, and a panel per axis that is on) and
speedup_batch.png (batch size). matplotlib with the Agg backend; each function returns its figure
(already saved and closed) so that tests can read the axes back.

Like is compared with like: a ddp/fsdp point's efficiency is against world x the single process
with the same threads per process (DDP at world 1 on a 2-core machine runs 2 threads: it is
compared with single-t2, not with the 1-thread baseline).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalelab.config import SpeedupConfig, strategies
from scalelab.study.measured import measured_singles, reference, seed_singles

WORKERS = tuple(s for s in strategies.STRATEGIES.values() if s.distributed)  # plotted against workers


def pyplot():
    """matplotlib's pyplot on the Agg backend (a cluster node has no display); the benchmarks' too."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fit_ylim(ax, values: list[float], floor: float = 0.0) -> None:
    """y from 0 to a little above the largest plotted value."""
    finite = [v for v in values if v == v]
    if finite:
        ax.set_ylim(floor, 1.1 * max(finite))


def plot(cfg: SpeedupConfig, frame: pd.DataFrame, path: Path):
    """Throughput and efficiency against workers at the reference axes, plus a precision panel
    (more than one precision) and a compile panel (compile off and on)."""
    plt = pyplot()
    extra = [axis for axis, on in (("precision", len(cfg.precisions) > 1), ("compile", len(cfg.compile) > 1)) if on]
    fig, axes = plt.subplots(1, 2 + len(extra), figsize=(5 * (2 + len(extra)), 4), squeeze=False)
    axes = list(axes[0])
    ref = reference(cfg, frame)
    _workers_panels(ref, seed_singles(frame, cfg.batch_sizes[0]), axes[0], axes[1])
    for ax, axis in zip(axes[2:], extra):
        _axis_panel(cfg, frame, axis, ax)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig


def _workers_panels(ref: pd.DataFrame, singles: pd.DataFrame, ax1, ax2) -> None:
    ok = ref[ref.status == "ok"]
    ticks: set[int] = set()
    tops: list[float] = []
    effs: list[float] = [1.0]
    for strategy in WORKERS:
        rows = ok[ok.strategy == strategy.name].sort_values("world_size")
        if rows.empty:
            continue
        ticks |= set(int(w) for w in rows.world_size)
        err = [rows.samples_per_s_median - rows.samples_per_s_min, rows.samples_per_s_max - rows.samples_per_s_median]
        label = strategy.label
        ax1.errorbar(
            rows.world_size, rows.samples_per_s_median, yerr=err, marker="o", label=f"{label} (median, min..max)"
        )
        ax2.plot(rows.world_size, rows.efficiency_vs_same_threads, marker="o", label=f"{label} measured")
        tops += list(rows.samples_per_s_max)
        effs += list(rows.efficiency_vs_same_threads)
        if strategy.reference and rows.predicted_efficiency.notna().any():
            ax2.plot(rows.world_size, rows.predicted_efficiency, marker="x", label="DDP predicted (model)")
            effs += list(rows.predicted_efficiency)
    if not singles.empty and ticks:
        base = singles.iloc[0].samples_per_s_median
        workers = sorted(ticks)
        ax1.plot(workers, [base * w for w in workers], "k--", label=f"ideal ({singles.iloc[0]['name']} x workers)")
        tops += [base * w for w in workers]
    ends = singles.iloc[[0, -1]] if not singles.empty else singles  # a study may have no single cell
    for style, (_, single) in zip((":", "-."), ends.drop_duplicates("name").iterrows()):
        ax1.axhline(single.samples_per_s_median, color="grey", linestyle=style, label=single["name"])
        tops.append(single.samples_per_s_median)
    ax2.axhline(1.0, color="k", linestyle="--", label="ideal")
    for ax in (ax1, ax2):
        ax.set_xticks(sorted(ticks) or [1])
    ax1.set(xlabel="workers", ylabel="samples/s", title="Throughput")
    ax2.set(xlabel="workers", ylabel="efficiency vs world x same-thread single", title="Efficiency")
    _fit_ylim(ax1, tops)
    _fit_ylim(ax2, effs)


def _axis_panel(cfg: SpeedupConfig, frame: pd.DataFrame, axis: str, ax) -> None:
    """Throughput of each setup at every value of one axis (the other axes at their reference)."""
    others = {"batch_size": cfg.batch_sizes[0], "precision": cfg.precisions[0], "compile": cfg.compile[0]}
    others["activation_checkpointing"] = cfg.activation_checkpointing[0]
    others.pop(axis)
    rows = frame[frame.status == "ok"]
    for key, value in others.items():
        rows = rows[rows[key] == value]
    values = cfg.precisions if axis == "precision" else cfg.compile
    keys = list(zip(rows.strategy, rows.world_size, rows.nodes, rows.threads_per_process))
    setups = list(dict.fromkeys(keys))
    names = {}  # a setup's label: its cell's name at the axis' first value (single-t1, ddp-w2)
    for key, name, value in zip(keys, rows["name"], rows[axis]):
        if key not in names or value == values[0]:
            names[key] = name
    width = 0.8 / max(1, len(values))
    tops = []
    for i, value in enumerate(values):
        heights = []
        for setup in setups:
            match = rows[
                (rows.strategy == setup[0])
                & (rows.world_size == setup[1])
                & (rows.nodes == setup[2])
                & (rows.threads_per_process == setup[3])
                & (rows[axis] == value)
            ]
            heights.append(match.samples_per_s_median.iloc[0] if len(match) else 0.0)
        ax.bar([j + i * width for j in range(len(setups))], heights, width, label=f"{axis}={value}")
        tops += heights
    ax.set_xticks([j + width * (len(values) - 1) / 2 for j in range(len(setups))])
    ax.set_xticklabels([names[s] for s in setups], rotation=30, fontsize="small")
    ax.set(ylabel="samples/s", title=f"Throughput by {axis}")
    _fit_ylim(ax, tops)


def plot_batch(frame: pd.DataFrame, batch: pd.DataFrame, path: Path):
    """Throughput and speedup vs the best single process, against batch size (fp32, eager)."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    batches = sorted(int(b) for b in batch.batch_size.unique()) if len(batch) else []
    tops, speeds = [], [1.0]
    singles = measured_singles(frame)
    singles = singles[
        (singles.precision == "fp32")
        & ~singles["compile"].astype(bool)
        & ~singles["activation_checkpointing"].astype(bool)
    ]
    for threads, rows in singles.groupby("threads_per_process"):
        rows = rows.sort_values("batch_size")
        ax1.plot(
            rows.batch_size, rows.samples_per_s_median, "k:" if threads == 1 else "k-.", label=f"single-t{threads}"
        )
        tops += list(rows.samples_per_s_median)
        batches = sorted(set(batches) | set(int(b) for b in rows.batch_size))
    for (strategy, world, nodes), rows in batch.groupby(["strategy", "world_size", "nodes"]):
        rows = rows.sort_values("batch_size")
        label = f"{strategy}-w{world}" + (f"-n{nodes}" if nodes > 1 else "")
        ax1.plot(rows.batch_size, rows.samples_per_s_median, marker="o", label=label)
        ax2.plot(rows.batch_size, rows.speedup_vs_best_single, marker="o", label=label)
        tops += list(rows.samples_per_s_median)
        speeds += list(rows.speedup_vs_best_single)
    ax2.axhline(1.0, color="k", linestyle="--", label="best single process")
    for ax in (ax1, ax2):
        if len(batches) > 1:
            ax.set_xscale("log", base=2)
        ax.set_xticks(batches or [1])
        ax.set_xticklabels([str(b) for b in batches or [1]])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    ax1.set(xlabel="batch size", ylabel="samples/s", title="Throughput by batch size")
    ax2.set(xlabel="batch size", ylabel="speedup vs best single process", title="Speedup by batch size")
    _fit_ylim(ax1, tops)
    _fit_ylim(ax2, speeds)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig
