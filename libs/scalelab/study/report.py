"""The study's outputs: speedup.csv, speedup.md, speedup.png, speedup.json, scaling.csv,
speedup_batch.csv/png, speedup_crossover.csv, and MLflow (a parent run, a child per cell).

The per-cell table is built in `measured`, the batch-size view in `batch`, the answer lines in
`answers` and the figures in `plots`; this module writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from scalelab.config import Params, SpeedupConfig, flatten, registry, strategies, to_dict
from scalelab.runtime.io import atomic_write_json, atomic_write_text
from scalelab.study import comm_model, plots
from scalelab.study.answers import answers, interval
from scalelab.study.batch import batch_table, crossover
from scalelab.study.measured import (
    COLUMNS,
    MEMORY,
    grad_bytes_of,
    is_noisy,
    predictions,
    reference,
    seed_singles,
    table,
)
from scalelab.tracking import MlflowTracker

__all__ = ["COLUMNS", "table", "write"]
MIB = 2**20
BATCH_FILES = ("speedup_batch.csv", "speedup_batch.png", "speedup_crossover.csv")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s" if not word.endswith("s") else f"{n} {word}es"


def _setup_label(row: pd.Series) -> str:
    """Names the setup with its threads per process: on a CPU, that is what each process gets."""
    threads = _count(row.threads_per_process, "thread")
    strategy = strategies.get(row.strategy)
    if not strategy.parallel:
        return f"{strategy.label} ({'1 GPU' if row.device == 'cuda' else threads})"
    nodes = f" on {row.nodes} nodes" if row.nodes > 1 else ""
    if not strategy.distributed:  # one process driving the GPUs (dp, CUDA only)
        return f"{strategy.label}, 1 process x {row.world_size} GPUs{nodes}"
    if row.device == "cuda":
        return f"{strategy.label}, {row.world_size} GPUs{nodes}"
    return f"{strategy.label}, {_count(row.world_size, 'process')}{nodes} x {threads}"


def _with_ci(row: pd.Series, column: str) -> str:
    text = interval(row[column], row[f"{column}_ci_low"], row[f"{column}_ci_high"], unit="")
    return "" if text == "n/a" else text


def article_table(frame: pd.DataFrame) -> str:
    """The reference article's shape: setup | training time (s) | speedup (with its 95% interval)."""
    lines = ["| setup | training time (s) | speedup |", "|---|---|---|"]
    for _, row in frame.iterrows():
        if row.status == "ok":
            speedup = interval(row.speedup, row.speedup_ci_low, row.speedup_ci_high)
            noisy = " (noisy)" if is_noisy(row.noisy) else ""
            lines.append(f"| {_setup_label(row)} | {row.train_time_s:,.1f} | {speedup}{noisy} |")
        else:
            lines.append(f"| {_setup_label(row)} | {row.status}: {row.reason} | {row.status} |")
    return "\n".join(lines)


def cells_table(frame: pd.DataFrame) -> pd.DataFrame:
    """speedup.csv as shown in speedup.md: each speedup and efficiency with its 95% interval."""
    shown = frame[["name", "strategy", "world_size", "nodes", "threads_per_process", "precision", "compile"]].copy()
    for column in ("batch_size", "global_batch", "samples_per_s_median", "step_time_ms_median", "train_time_s"):
        shown[column] = frame[column]
    for column in ("speedup", "speedup_vs_single_t1", "speedup_vs_single_all", "efficiency"):
        shown[column] = [_with_ci(row, column) for _, row in frame.iterrows()]
    shown["predicted_efficiency"] = frame.predicted_efficiency
    shown["noisy"] = ["noisy" if is_noisy(v) else "" for v in frame.noisy]
    shown["compile_s"] = frame.compile_s
    shown["break_even_steps"] = frame.break_even_steps
    shown["peak_mem_mib"] = frame.peak_mem_bytes_per_rank / MIB
    state = frame.param_bytes_per_rank + frame.grad_bytes_per_rank + frame.optim_bytes_per_rank
    shown["state_mib"] = state / MIB
    shown["repeats"] = [_repeats_shown(row) for _, row in frame.iterrows()]
    for column in ("status", "reason", "cached"):
        shown[column] = frame[column]
    return shown


def _repeats_shown(row: pd.Series) -> str:
    """'3 kept' or '2 kept, 1 busy: others held 52% of the CPU (> 25%)' (study.busy)."""
    if row.repeats_kept != row.repeats_kept:  # not measured
        return ""
    return f"{int(row.repeats_kept)} kept" + (f", dropped {row.dropped_why}" if row.dropped_why else "")


def batch_shown(batch: pd.DataFrame) -> pd.DataFrame:
    shown = batch[["name", "world_size", "threads_per_process", "batch_size", "samples_per_s_median"]].copy()
    shown["best_single"] = batch.best_single
    for column, key in (("speedup_vs_best_single", "speedup"), ("efficiency", "efficiency")):
        shown[column] = [
            interval(r[column], r[f"{key}_ci_low"], r[f"{key}_ci_high"], unit="") for _, r in batch.iterrows()
        ]
    shown["noisy"] = ["noisy" if is_noisy(v) else "" for v in batch.noisy]
    return shown


def headline(cfg: SpeedupConfig, frame: pd.DataFrame) -> dict[str, Any]:
    """The largest measured ddp cell's speedup and efficiency at the reference axes (DVC metrics)."""
    ref = reference(cfg, frame)
    invalid = ref[ref.status == "invalid"]
    if len(invalid):  # a busy machine: no number is stated, whichever cell it touched
        taken = frame.others_cpu_share_max.max()
        took = f"up to {taken:.0%} of the CPU" if taken == taken else "the CPU"
        return {
            "headline": f"not measured: {len(invalid)} of {len(ref)} cells of the article's table were "
            f"measured while the machine was busy ({', '.join(invalid['name'])}: impossible speedups or every "
            f"repeat busy): other processes took {took} during the study; rerun on an idle machine",
            "baseline": cfg.baseline,
            "scaling": cfg.scaling,
        }
    ddp = ref[(ref.strategy == strategies.reference().name) & (ref.status == "ok")].sort_values("world_size")
    if ddp.empty:
        return {"headline": "no ddp cell was measured", "baseline": cfg.baseline, "scaling": cfg.scaling}
    top = ddp.iloc[-1]
    noisy = any(is_noisy(v) for v in [top.noisy, *seed_singles(frame, cfg.batch_sizes[0]).noisy])
    dropped = int(ref.repeats_dropped.fillna(0).sum())
    return {
        "ddp_world_size": int(top.world_size),
        "ddp_speedup": float(top.speedup),
        "ddp_speedup_ci_low": float(top.speedup_ci_low),
        "ddp_speedup_ci_high": float(top.speedup_ci_high),
        "ddp_efficiency": float(top.efficiency),
        "ddp_efficiency_ci_low": float(top.efficiency_ci_low),
        "ddp_efficiency_ci_high": float(top.efficiency_ci_high),
        "ddp_predicted_efficiency": float(top.predicted_efficiency),
        "ddp_samples_per_s": float(top.samples_per_s_median),
        "noisy": noisy,
        "baseline": cfg.baseline,
        "scaling": cfg.scaling,
        "headline": f"ddp x{int(top.world_size)}: {top.speedup:.2f}x [{top.speedup_ci_low:.2f}, "
        f"{top.speedup_ci_high:.2f}] vs {cfg.baseline}, efficiency {top.efficiency:.2f} "
        f"[{top.efficiency_ci_low:.2f}, {top.efficiency_ci_high:.2f}] ({cfg.scaling} scaling)"
        + (", noisy: the repeats spread by more than 10%" if noisy else "")
        + (f"; {dropped} busy repeats dropped (speedup.md: All cells)" if dropped else ""),
        "repeats_dropped": dropped,
    }


def explain(cfg: SpeedupConfig, frame: pd.DataFrame, link: comm_model.Link | None, grad_bytes: float) -> str:
    """Why the figure is what it is, from the measured numbers."""
    lines = []
    singles = seed_singles(frame, cfg.batch_sizes[0])
    if link is not None and not singles.empty:
        compute_ms = singles.iloc[0].step_time_ms_median
        ddp = frame[(frame.strategy == strategies.reference().name) & (frame.status == "ok")]
        world = int(ddp.world_size.max()) if not ddp.empty else 2
        comm_ms = 1000 * link.allreduce_s(world, grad_bytes)
        lines.append(
            f"- One step computes for {compute_ms:,.1f} ms on one process; all-reducing the "
            f"{grad_bytes / MIB:,.1f} MiB of gradients over {world} ranks costs {comm_ms:,.1f} ms "
            f"on the measured link ({link.bandwidth_b_s / 1e9:,.2f} GB/s, "
            f"{link.latency_s * 1e6:,.0f} us latency). "
            + (
                "Compute dominates, so DDP can scale."
                if compute_ms > comm_ms
                else "Communication costs as much as compute or more, so DDP cannot scale at this batch."
            )
        )
    lines.append(
        "- Processes here share one machine: memory bandwidth and caches are shared, and on a "
        "CPU the gloo all-reduce runs on the same cores as compute (no overlap), so measured "
        "efficiency sits below the model's."
    )
    lines.append("- Skipped rows could not run on this hardware; their reason is given instead of a number.")
    return "\n".join(lines)


def method(cfg: SpeedupConfig) -> str:
    return "\n".join(
        [
            f"- Baseline for `speedup`: **{cfg.baseline}**; `speedup_vs_single_t1` and `speedup_vs_single_all` "
            "give both single-process baselines (1 thread, all cores). Every baseline is the seed: the single "
            "process at the cell's own batch size, in fp32 and eager, so a bf16 or compiled cell's speedup "
            "holds that effect too.",
            f"- Scaling mode: **{cfg.scaling}** ("
            + ("fixed per-rank batch" if cfg.scaling == "weak" else "fixed global batch")
            + f", batch_sizes {cfg.batch_sizes}; precisions {cfg.precisions}; compile {cfg.compile}). "
            f"The article's table is at the first of each: batch {cfg.batch_sizes[0]}, {cfg.precisions[0]}, "
            f"compile {str(cfg.compile[0]).lower()}.",
            f"- {cfg.warmup_steps} warm-up steps excluded, then {cfg.repeats} repeats of {cfg.timed_steps} "
            "timed steps, taken in rounds (one repeat of every cell per round); median and min..max over "
            "repeats; the slowest rank sets each repeat's time. A repeat during which other processes (and "
            f"steal) held more than {cfg.max_others_cpu_share:.0%} of the cores is busy: the cell takes another "
            f"in a later round, up to {cfg.max_retries} more, and busy repeats are dropped (column `repeats`).",
            "- Intervals [low, high] are bootstrap 95% intervals of the ratio of medians: the cell's and the "
            "baseline's per-repeat samples/s resampled independently (fixed seed). A cell is `noisy` when its "
            "repeats spread by more than 10% ((max - min) / median of samples/s).",
            "- Efficiency = speedup / world size. `efficiency_vs_same_threads` (speedup.csv, the figure) divides "
            "by world x the single process with the same threads per process instead. Predicted efficiency: "
            "ring all-reduce model 2(N-1)/N * S/B + 2(N-1) * latency, fitted to an all-reduce microbenchmark on "
            "the study's own backend with the model's gradient size, added to the measured single-process "
            "compute time (no overlap).",
            "- Compile: `compile_s` = (first step - median timed step) less the same of the same cell eager "
            "(without it measured: not less); `break_even_steps` = compile_s / (eager step - compiled step). "
            "Memory per rank: peak (`mem_kind`, from after the model is wrapped; dp: its busiest GPU) and "
            "the parameter, gradient and optimizer bytes the rank holds.",
        ]
    )


def synthetic_data(cfg: SpeedupConfig) -> str:
    """What the cells feed: random feature vectors, or the workload's own synthetic batches."""
    if hasattr(registry.workload_module(cfg.workload, "speedup"), "synthetic_batch"):
        return f"its own synthetic batches (experiments/{cfg.workload}.py `synthetic_batch`; a sample is one sequence)"
    return f"synthetic data ({cfg.num_features} features, {cfg.num_classes} classes)"


def markdown(
    cfg: SpeedupConfig,
    frame: pd.DataFrame,
    preds: pd.DataFrame,
    link: comm_model.Link | None,
    grad_bytes: float,
    hw: dict[str, str],
    batch: pd.DataFrame,
    cross: pd.DataFrame,
) -> str:
    parts = [
        "# Speedup study",
        "",
        f"Workload: `{cfg.workload}` {cfg.model} on {synthetic_data(cfg)}, batches already on the device: "
        "this measures compute and "
        "communication, not data loading. (The train/evaluate stages use the real dataset for "
        "accuracy; this study's workload is sized so that compute per step dominates communication.)",
        f"Hardware: {hw.get('env.cpu', '?')}, {hw.get('env.cpu_cores', '?')} cores"
        + (f"; GPUs: {hw['env.gpus']}" if "env.gpus" in hw else "; no GPU")
        + ".",
        "",
        "## The article's table",
        "",
        article_table(reference(cfg, frame)),
        "",
        f"Training time = {cfg.work_samples:,} samples / median measured throughput; speedup with its "
        "bootstrap 95% interval.",
        "",
        "## Answers",
        "",
        answers(cfg, frame, cross),
        "",
        "## All cells",
        "",
        markdown_table(cells_table(frame)),
        "",
        "## Batch size (fp32, eager)",
        "",
        markdown_table(batch_shown(batch)) if len(batch) else "No ddp or fsdp cell was measured in fp32, eager.",
        "",
    ]
    if len(cross):
        parts += ["Crossover: the smallest batch at which DDP beats the best single process.", ""]
        parts += [markdown_table(cross), ""]
    parts += ["## Method", "", method(cfg), "", "## Why the figure is what it is", ""]
    parts += [explain(cfg, frame, link, grad_bytes), ""]
    if not preds.empty:
        parts += [
            "## Prediction (not measured)",
            "",
            "Predicted efficiency at larger world sizes under named interconnect presets, using "
            "this machine's measured compute time per step. A prediction, not a measurement.",
            "",
            markdown_table(preds),
            "",
        ]
    return "\n".join(parts)


def write(
    params: Params, cells: list, results: dict[str, dict], comm: dict | None, hw: dict[str, str], out: Path
) -> dict[str, Any]:
    """Writes every output and logs the study to MLflow; returns the headline metrics."""
    cfg = params.speedup
    link = None
    if comm:
        link = comm_model.fit(
            comm["world_size"], [s["bytes"] for s in comm["sizes"]], [s["median_s"] for s in comm["sizes"]]
        )
    frame = table(cfg, cells, results, link)
    grad_bytes = grad_bytes_of(results)
    preds = predictions(cfg, frame, grad_bytes)
    batch = batch_table(frame, results)
    cross = crossover(cfg, frame, batch, link, grad_bytes)
    head = {**headline(cfg, frame), "invalid_cells": int((frame.status == "invalid").sum())}
    if link is not None:
        head.update(allreduce_bandwidth_gb_s=link.bandwidth_b_s / 1e9, allreduce_latency_us=link.latency_s * 1e6)
    whole = {m: frame[m].round().astype("Int64") for m in MEMORY}  # bytes: whole numbers, empty when not measured
    frame.assign(**whole).to_csv(out / "speedup.csv", index=False)
    batch.to_csv(out / "speedup_batch.csv", index=False)
    cross.to_csv(out / "speedup_crossover.csv", index=False)
    ref = reference(cfg, frame)
    ddp = ref[(ref.strategy == strategies.reference().name) & (ref.status == "ok")].sort_values("world_size")
    base = seed_singles(frame, cfg.batch_sizes[0])
    base_sps = base.iloc[0].samples_per_s_median if len(base) else float("nan")
    scaling = pd.DataFrame(
        {"workers": ddp.world_size, "measured": ddp.samples_per_s_median, "ideal": ddp.world_size * base_sps}
    )
    scaling.to_csv(out / "scaling.csv", index=False)
    atomic_write_text(out / "speedup.md", markdown(cfg, frame, preds, link, grad_bytes, hw, batch, cross))
    plots.plot(cfg, frame, out / "speedup.png")
    plots.plot_batch(frame, batch, out / "speedup_batch.png")
    atomic_write_json(out / "speedup.json", head)
    if params.tracking.enabled:
        log_study(params, cells, frame, results, head, out)
    return head


def log_study(
    params: Params, cells: list, frame: pd.DataFrame, results: dict[str, dict], head: dict[str, Any], out: Path
) -> None:
    """One parent run for the study; a nested child run per cell."""
    cfg = params.speedup
    tags = {"scalelab.kind": "study", "scalelab.study": "speedup"}
    headline_tag = {"scalelab.headline": head["headline"]}  # the number, or in words why none is stated
    starts = [r["started_ms"] for r in results.values() if "started_ms" in r and not r.get("cached")]
    parent = MlflowTracker.open(
        params.tracking.experiment,
        run_name=f"speedup-{cfg.scaling}",
        tags=tags | headline_tag,
        start_ms=min(starts, default=None),
    )
    parent.log_params(flatten({"speedup": to_dict(cfg)}))
    parent.log_metrics({k: v for k, v in head.items() if isinstance(v, (int, float))}, 0)
    for name in ("speedup.csv", "speedup.md", "speedup.png", "speedup.json", "scaling.csv", *BATCH_FILES):
        if (out / name).is_file():
            parent.log_artifact(out / name)
    for cell, (_, row) in zip(cells, frame.iterrows()):
        res = results[cell.name]
        skipped = row.status == "skipped"
        child = MlflowTracker.open(
            params.tracking.experiment,
            run_name=f"{cell.name}-seed{cfg.seed}" + (" (skipped)" if skipped else ""),
            parent_run_id=parent.run_id,
            start_ms=res.get("started_ms"),  # the run spans the cell's measurement (cached: when it was made)
            tags={
                **tags,
                "scalelab.kind": "study-cell",
                "scalelab.strategy": cell.strategy,
                "scalelab.status": row.status,
                "scalelab.reason": row.reason,
                "scalelab.cached": row.cached,
                "scalelab.noisy": is_noisy(row.noisy),
            },
        )
        child.log_params(
            {
                "strategy": cell.strategy,
                "world_size": cell.world_size,
                "nodes": cell.nodes,
                "threads_per_process": cell.threads_per_process,
                "device": cell.device,
                "seed.base": cfg.seed,
                "scaling": cfg.scaling,
                "precision": cell.precision,
                "compile": cell.compile,
                "activation_checkpointing": cell.activation_checkpointing,
                "batch_size": cell.batch_size,
            }
        )
        numbers = {k: row[k] for k in COLUMNS if isinstance(row[k], float) and row[k] == row[k]}
        child.log_metrics(numbers, 0)
        for i, (sps, ms) in enumerate(zip(res.get("samples_per_s", []), res.get("step_time_ms", []))):
            child.log_metrics({"repeat_samples_per_s": sps, "repeat_step_time_ms": ms}, i)
        # a skipped cell never ran: KILLED, not a green FINISHED, with the reason in its name and tags
        child.finish("KILLED" if skipped else "FINISHED", end_ms=res.get("ended_ms"))
    parent.finish("FINISHED")
