"""The "## Answers" section of speedup.md: one numbered line per question, each naming the cells
its figure comes from."""

from __future__ import annotations

import statistics

import pandas as pd

from scalelab.config import SpeedupConfig
from scalelab.study.measured import reference

SAME_SETUP = ["strategy", "world_size", "nodes", "threads_per_process", "batch_size"]
MIB = 2**20


def interval(value: float, low: float, high: float, unit: str = "x") -> str:
    """1.85x [1.80, 1.90]: a figure with its bootstrap 95% interval."""
    if value != value:
        return "n/a"
    return f"{value:.2f}{unit} [{low:.2f}, {high:.2f}]" if low == low else f"{value:.2f}{unit}"


def fastest(frame: pd.DataFrame) -> str:
    ok = frame[frame.status == "ok"]
    if ok.empty:
        return "no cell was measured"
    top = ok.loc[ok.samples_per_s_median.idxmax()]
    return (
        f"`{top['name']}`, {top.samples_per_s_median:,.0f} samples/s, speedup "
        f"{interval(top.speedup, top.speedup_ci_low, top.speedup_ci_high)}"
    )


def best_per_world(cfg: SpeedupConfig, frame: pd.DataFrame) -> str:
    """At the reference axes, the fastest cell at each world size (singles are world 1)."""
    ok = reference(cfg, frame)
    ok = ok[ok.status == "ok"]
    parts = []
    for world, group in ok.groupby("world_size"):
        top = group.loc[group.samples_per_s_median.idxmax()]
        parts.append(f"{world}: `{top['name']}` ({top.strategy}, {top.samples_per_s_median:,.0f} samples/s)")
    return "; ".join(parts) if parts else "no cell was measured"


def pairs(frame: pd.DataFrame, axis: str, value, against) -> list[tuple[pd.Series, pd.Series]]:
    """(cell, twin) pairs: measured cells at axis=value and the measured cell that differs only there."""
    ok = frame[frame.status == "ok"]
    other = [k for k in ("precision", "compile", "activation_checkpointing") if k != axis]
    found = []
    for _, row in ok[ok[axis] == value].iterrows():
        twin = ok[(ok[axis] == against) & (ok[SAME_SETUP + other] == row[SAME_SETUP + other]).all(axis=1)]
        if len(twin):
            found.append((row, twin.iloc[0]))
    return found


def precision_gain(cfg: SpeedupConfig, frame: pd.DataFrame, precision: str) -> str:
    found = pairs(frame, "precision", precision, "fp32")
    if not found:
        reasons = frame[(frame.precision == precision) & (frame.status != "ok")].reason
        why = f" ({reasons.iloc[0]})" if len(reasons) else ""
        return f"not measured{why}"
    return _ratios(found, f"{precision} vs fp32")


def compile_gain(frame: pd.DataFrame) -> str:
    found = pairs(frame, "compile", True, False)
    if not found:
        return "not measured"
    text = _ratios(found, "compiled vs eager")
    best, _ = max(found, key=lambda p: p[0].samples_per_s_median / p[1].samples_per_s_median)
    steps = best.break_even_steps
    pays = f"pays back after {steps:,.0f} steps" if steps == steps else "never pays back (not faster)"
    compile_s = f"{best.compile_s:,.1f} s" if best.compile_s == best.compile_s else "unknown"
    return f"{text}; `{best['name']}` compiles in {compile_s} and {pays}"


def checkpointing_saves(frame: pd.DataFrame) -> str:
    """Peak memory per rank with activation checkpointing against the same cell without it."""
    found = [(a, b) for a, b in pairs(frame, "activation_checkpointing", True, False)
             if a.peak_mem_bytes_per_rank == a.peak_mem_bytes_per_rank]  # fmt: skip
    if not found:
        return "not measured"
    parts = []
    for a, b in found:
        on, off = a.peak_mem_bytes_per_rank, b.peak_mem_bytes_per_rank
        parts.append(
            f"`{a['name']}` peak {on / MIB:,.1f} MiB per rank vs {off / MIB:,.1f} MiB (`{b['name']}`, "
            f"{on / off - 1:+.0%}) at {a.samples_per_s_median / b.samples_per_s_median:.2f}x the throughput"
        )
    return "; ".join(parts)


def _ratios(found: list[tuple[pd.Series, pd.Series]], what: str) -> str:
    ratios = [(a.samples_per_s_median / b.samples_per_s_median, a, b) for a, b in found]
    best, a, b = max(ratios, key=lambda r: r[0])
    median = statistics.median(r for r, _, _ in ratios)
    return f"{what}: best {best:.2f}x (`{a['name']}` vs `{b['name']}`), median {median:.2f}x over {len(ratios)} pair(s)"


def crossover_line(cross: pd.DataFrame, scaling: str) -> str:
    if cross.empty:
        return "no ddp cell at world size > 1 was measured in fp32, eager"
    unit = "per-rank batch" if scaling == "weak" else "global batch"
    parts = [
        f"`ddp-w{r.world_size}`" + (f" on {r.nodes} nodes" if r.nodes > 1 else "") + f": measured {r.measured}; "
        f"predicted {r.predicted}"
        for r in cross.itertuples()
    ]
    return f"({unit}, vs the best single process at that batch) " + "; ".join(parts)


def memory_line(cfg: SpeedupConfig, frame: pd.DataFrame) -> str:
    """Per strategy at the reference axes: peak memory and the state bytes one rank holds."""
    ok = reference(cfg, frame)
    ok = ok[(ok.status == "ok") & ok.peak_mem_bytes_per_rank.notna()]
    if ok.empty:
        return "not measured (the cells did not report memory)"
    parts = []
    for strategy, group in ok.groupby("strategy", sort=False):
        cells = []
        for _, r in group.sort_values("world_size").iterrows():
            state = r.param_bytes_per_rank + r.grad_bytes_per_rank + r.optim_bytes_per_rank
            cells.append(
                f"`{r['name']}` peak {r.peak_mem_bytes_per_rank / MIB:,.1f} MiB ({r.mem_kind}), "
                f"params+grads+optimizer {r.param_bytes_per_rank / MIB:,.1f}+{r.grad_bytes_per_rank / MIB:,.1f}"
                f"+{r.optim_bytes_per_rank / MIB:,.1f} = {state / MIB:,.1f} MiB"
            )
        parts.append(f"{strategy}: " + ", ".join(cells))
    return "; ".join(parts)


def answers(cfg: SpeedupConfig, frame: pd.DataFrame, cross: pd.DataFrame) -> str:
    invalid = frame[frame.status == "invalid"]
    busy = (
        f"Left out of every answer: {len(invalid)} cell(s) measured while other processes held the CPU "
        f"({', '.join(invalid['name'])}: speedups no core count allows, or every repeat busy). "
        "Rerun on an idle machine.\n"
        if len(invalid)
        else ""
    )
    lines = [
        f"1. Fastest setup: {fastest(frame)}.",
        f"2. Best strategy per world size (batch {cfg.batch_sizes[0]}, {cfg.precisions[0]}, "
        f"compile {str(cfg.compile[0]).lower()}): {best_per_world(cfg, frame)}.",
    ]
    low = [p for p in ("bf16", "fp16") if p in cfg.precisions] or ["bf16"]
    for precision in low:
        lines.append(f"{len(lines) + 1}. What {precision} buys: {precision_gain(cfg, frame, precision)}.")
    lines.append(f"{len(lines) + 1}. What compile buys: {compile_gain(frame)}.")
    if True in cfg.activation_checkpointing:
        lines.append(f"{len(lines) + 1}. What activation checkpointing saves: {checkpointing_saves(frame)}.")
    lines.append(f"{len(lines) + 1}. Crossover batch: {crossover_line(cross, cfg.scaling)}.")
    lines.append(f"{len(lines) + 1}. Memory per rank: {memory_line(cfg, frame)}.")
    return busy + "\n".join(lines)
