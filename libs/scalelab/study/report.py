"""The study's outputs: speedup.csv, speedup.md, speedup.png, speedup.json, scaling.csv, MLflow."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from scalelab.config import Params, SpeedupConfig, flatten, to_dict
from scalelab.runtime.io import atomic_write_json, atomic_write_text
from scalelab.study import comm_model
from scalelab.tracking import MlflowTracker

COLUMNS = [
    "name",
    "strategy",
    "world_size",
    "nodes",
    "threads_per_process",
    "device",
    "global_batch",
    "samples_per_s_median",
    "samples_per_s_min",
    "samples_per_s_max",
    "step_time_ms_median",
    "step_time_ms_min",
    "step_time_ms_max",
    "train_time_s",
    "speedup",
    "speedup_vs_single_t1",
    "speedup_vs_single_all",
    "efficiency",
    "predicted_efficiency",
    "status",
    "reason",
    "cached",
]


def measured_singles(frame: pd.DataFrame) -> pd.DataFrame:
    """The measured single-process rows, fewest threads (the 1-thread baseline) first."""
    return frame[(frame.strategy == "single") & (frame.status == "ok")].sort_values("threads_per_process")


def grad_bytes_of(results: dict[str, dict]) -> int:
    """The model's gradient size, from any measured cell."""
    return next((r["grad_bytes"] for r in results.values() if r["status"] == "ok"), 0)


def table(cfg: SpeedupConfig, cells: list, results: dict[str, dict], link: comm_model.Link | None) -> pd.DataFrame:
    """One row per cell; speedups against both single-process baselines."""
    rows = []
    for cell in cells:
        res = results[cell.name]
        row = {
            "name": cell.name,
            "strategy": cell.strategy,
            "world_size": cell.world_size,
            "nodes": cell.nodes,
            "threads_per_process": cell.threads_per_process,
            "device": cell.device,
            "status": res["status"],
            "reason": res.get("reason", ""),
            "cached": res.get("cached", False),
        }
        if res["status"] == "ok":
            sps, step = res["samples_per_s"], res["step_time_ms"]
            row.update(
                global_batch=res["global_batch"],
                samples_per_s_median=statistics.median(sps),
                samples_per_s_min=min(sps),
                samples_per_s_max=max(sps),
                step_time_ms_median=statistics.median(step),
                step_time_ms_min=min(step),
                step_time_ms_max=max(step),
                train_time_s=cfg.work_samples / statistics.median(sps),
            )
        rows.append(row)
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    singles = measured_singles(frame)
    for label, pick in (("single_t1", 0), ("single_all", -1)):
        base = singles.iloc[pick].samples_per_s_median if len(singles) else float("nan")
        frame[f"speedup_vs_{label}"] = frame.samples_per_s_median / base
    frame["speedup"] = frame[f"speedup_vs_{cfg.baseline.replace('-', '_')}"]
    frame["efficiency"] = frame.speedup / frame.world_size
    grad_bytes = grad_bytes_of(results)
    frame["predicted_efficiency"] = [_predicted(cfg, row, singles, link, grad_bytes) for _, row in frame.iterrows()]
    return frame


def _predicted(
    cfg: SpeedupConfig, row: pd.Series, singles: pd.DataFrame, link: comm_model.Link | None, grad_bytes: float
) -> float:
    """Model efficiency of a measured ddp row, from the single process with the same threads."""
    if row.strategy != "ddp" or row.status != "ok" or link is None or singles.empty:
        return float("nan")
    same = singles[singles.threads_per_process == row.threads_per_process]
    compute_1_s = (same if len(same) else singles).iloc[0].step_time_ms_median / 1000.0
    if cfg.scaling == "weak":
        return comm_model.efficiency(compute_1_s, row.world_size, grad_bytes, link)
    return comm_model.strong_efficiency(compute_1_s, row.world_size, grad_bytes, link)


def predictions(cfg: SpeedupConfig, frame: pd.DataFrame, grad_bytes: float) -> pd.DataFrame:
    """Predicted efficiency at large world sizes under the named interconnect presets."""
    singles = measured_singles(frame)
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


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _setup_label(row: pd.Series) -> str:
    if row.strategy == "single":
        unit = "1 GPU" if row.device == "cuda" else f"{row.threads_per_process} thread(s)"
        return f"single process ({unit})"
    unit = "GPUs" if row.device == "cuda" else "processes"
    name = "DataParallel" if row.strategy == "dp" else "DDP"
    return f"{name}, {row.world_size} {unit}" + (f" on {row.nodes} nodes" if row.nodes > 1 else "")


def article_table(frame: pd.DataFrame) -> str:
    """The reference article's shape: setup | training time (s) | speedup."""
    lines = ["| setup | training time (s) | speedup |", "|---|---|---|"]
    for _, row in frame.iterrows():
        if row.status == "ok":
            lines.append(f"| {_setup_label(row)} | {row.train_time_s:,.1f} | {row.speedup:.2f}x |")
        else:
            lines.append(f"| {_setup_label(row)} | {row.status}: {row.reason} | {row.status} |")
    return "\n".join(lines)


def headline(cfg: SpeedupConfig, frame: pd.DataFrame) -> dict[str, Any]:
    """The largest measured ddp cell's speedup and efficiency (DVC metrics)."""
    ddp = frame[(frame.strategy == "ddp") & (frame.status == "ok")].sort_values("world_size")
    if ddp.empty:
        return {"headline": "no ddp cell was measured", "baseline": cfg.baseline, "scaling": cfg.scaling}
    top = ddp.iloc[-1]
    return {
        "ddp_world_size": int(top.world_size),
        "ddp_speedup": float(top.speedup),
        "ddp_efficiency": float(top.efficiency),
        "ddp_predicted_efficiency": float(top.predicted_efficiency),
        "ddp_samples_per_s": float(top.samples_per_s_median),
        "baseline": cfg.baseline,
        "scaling": cfg.scaling,
        "headline": f"ddp x{int(top.world_size)}: {top.speedup:.2f}x vs {cfg.baseline}, "
        f"efficiency {top.efficiency:.2f} ({cfg.scaling} scaling)",
    }


def explain(cfg: SpeedupConfig, frame: pd.DataFrame, link: comm_model.Link | None, grad_bytes: float) -> str:
    """Why the figure is what it is, from the measured numbers."""
    lines = []
    singles = measured_singles(frame)
    if link is not None and not singles.empty:
        compute_ms = singles.iloc[0].step_time_ms_median
        ddp = frame[(frame.strategy == "ddp") & (frame.status == "ok")]
        world = int(ddp.world_size.max()) if not ddp.empty else 2
        comm_ms = 1000 * link.allreduce_s(world, grad_bytes)
        lines.append(
            f"- One step computes for {compute_ms:,.1f} ms on one process; all-reducing the "
            f"{grad_bytes / 2**20:,.1f} MiB of gradients over {world} ranks costs {comm_ms:,.1f} ms "
            f"on the measured link ({link.bandwidth_b_s / 1e9:,.2f} GB/s, "
            f"{link.latency_s * 1e6:,.0f} us latency). Compute dominates, so DDP can scale."
        )
    lines.append(
        "- Processes here share one machine: memory bandwidth and caches are shared, and on a "
        "CPU the gloo all-reduce runs on the same cores as compute (no overlap), so measured "
        "efficiency sits below the model's."
    )
    lines.append("- Skipped rows could not run on this hardware; their reason is given instead of a number.")
    return "\n".join(lines)


def markdown(
    cfg: SpeedupConfig,
    frame: pd.DataFrame,
    preds: pd.DataFrame,
    link: comm_model.Link | None,
    grad_bytes: float,
    hw: dict[str, str],
) -> str:
    shown = frame.drop(columns=["device"]).copy()
    parts = [
        "# Speedup study",
        "",
        f"Workload: `{cfg.workload}` {cfg.model} on synthetic data ({cfg.num_features} features, "
        f"{cfg.num_classes} classes), batches already on the device: this measures compute and "
        "communication, not data loading. (The train/evaluate stages use the real dataset for "
        "accuracy; this study's workload is sized so that compute per step dominates communication.)",
        f"Hardware: {hw.get('env.cpu', '?')}, {hw.get('env.cpu_cores', '?')} cores"
        + (f"; GPUs: {hw['env.gpus']}" if "env.gpus" in hw else "; no GPU")
        + ".",
        "",
        "## The article's table",
        "",
        article_table(frame),
        "",
        f"Training time = {cfg.work_samples:,} samples / median measured throughput.",
        "",
        "## All cells",
        "",
        markdown_table(shown),
        "",
        "## Method",
        "",
        f"- Baseline for `speedup`: **{cfg.baseline}**; `speedup_vs_single_t1` and `speedup_vs_single_all` "
        "give both single-process baselines (1 thread, all cores).",
        f"- Scaling mode: **{cfg.scaling}** ("
        + ("fixed per-rank batch" if cfg.scaling == "weak" else "fixed global batch")
        + f", batch_size {cfg.batch_size}).",
        f"- {cfg.warmup_steps} warm-up steps excluded, then {cfg.repeats} repeats of {cfg.timed_steps} "
        "timed steps; median and min..max over repeats; the slowest rank sets each repeat's time.",
        "- Efficiency = speedup / world size. Predicted efficiency: ring all-reduce model "
        "2(N-1)/N * S/B + 2(N-1) * latency, fitted to an all-reduce microbenchmark on the study's own "
        "backend with the model's gradient size, added to the measured single-process compute time "
        "(no overlap).",
        "",
        "## Why the figure is what it is",
        "",
        explain(cfg, frame, link, grad_bytes),
        "",
    ]
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


def plot(frame: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ddp = frame[(frame.strategy == "ddp") & (frame.status == "ok")].sort_values("world_size")
    singles = measured_singles(frame)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    if not ddp.empty and not singles.empty:
        base = singles.iloc[0].samples_per_s_median
        err = [ddp.samples_per_s_median - ddp.samples_per_s_min, ddp.samples_per_s_max - ddp.samples_per_s_median]
        ax1.errorbar(ddp.world_size, ddp.samples_per_s_median, yerr=err, marker="o", label="DDP (median, min..max)")
        ax1.plot(ddp.world_size, base * ddp.world_size, "k--", label="ideal")
        ax2.plot(ddp.world_size, ddp.efficiency, marker="o", label="measured")
        ax2.plot(ddp.world_size, ddp.predicted_efficiency, marker="x", label="predicted (model)")
        ax2.axhline(1.0, color="k", linestyle="--", label="ideal")
    ax1.set(xlabel="workers", ylabel="samples/s", title="Throughput")
    ax2.set(xlabel="workers", ylabel="efficiency", title="Efficiency", ylim=(0, 1.1))
    for ax in (ax1, ax2):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
    head = headline(cfg, frame)
    if link is not None:
        head.update(allreduce_bandwidth_gb_s=link.bandwidth_b_s / 1e9, allreduce_latency_us=link.latency_s * 1e6)
    frame.to_csv(out / "speedup.csv", index=False)
    ddp = frame[(frame.strategy == "ddp") & (frame.status == "ok")].sort_values("world_size")
    base = measured_singles(frame)
    base_sps = base.iloc[0].samples_per_s_median if len(base) else float("nan")
    scaling = pd.DataFrame(
        {"workers": ddp.world_size, "measured": ddp.samples_per_s_median, "ideal": ddp.world_size * base_sps}
    )
    scaling.to_csv(out / "scaling.csv", index=False)
    atomic_write_text(out / "speedup.md", markdown(cfg, frame, preds, link, grad_bytes, hw))
    plot(frame, out / "speedup.png")
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
    parent = MlflowTracker.open(params.tracking.experiment, run_name=f"speedup-{cfg.scaling}", tags=tags)
    parent.log_params(flatten({"speedup": to_dict(cfg)}))
    parent.log_metrics({k: v for k, v in head.items() if isinstance(v, (int, float))}, 0)
    for name in ("speedup.csv", "speedup.md", "speedup.png", "speedup.json", "scaling.csv"):
        parent.log_artifact(out / name)
    for cell, (_, row) in zip(cells, frame.iterrows()):
        child = MlflowTracker.open(
            params.tracking.experiment,
            run_name=f"{cell.name}-seed{cfg.seed}",
            parent_run_id=parent.run_id,
            tags={
                **tags,
                "scalelab.kind": "study-cell",
                "scalelab.strategy": cell.strategy,
                "scalelab.status": row.status,
                "scalelab.reason": row.reason,
                "scalelab.cached": row.cached,
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
                "batch_size": cfg.batch_size,
            }
        )
        numbers = {k: row[k] for k in COLUMNS if isinstance(row[k], float) and row[k] == row[k]}
        child.log_metrics(numbers, 0)
        res = results[cell.name]
        for i, (sps, ms) in enumerate(zip(res.get("samples_per_s", []), res.get("step_time_ms", []))):
            child.log_metrics({"repeat_samples_per_s": sps, "repeat_step_time_ms": ms}, i)
        child.finish("FINISHED")
    parent.finish("FINISHED")
