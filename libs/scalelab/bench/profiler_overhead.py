"""What `train.profile` costs a whole training run: `scalelab train` with the profiler on and off."""

from __future__ import annotations

import json
import resource
import shutil
import time
from pathlib import Path
from typing import Any

from scalelab.bench import harness, pipeline, stats
from scalelab.bench.harness import Goal, opt
from scalelab.config.loader import ConfigError
from scalelab.config.overrides import apply

METHOD = """\
`scalelab train` on params.yaml (changed only by `--set`) as a fresh process, on the pipeline's prepared data (made
once from the same params), tracking into a private SQLite MLflow store (schema made before the first timed run).
Arms `off` and `on` (train.profile.enabled: torch.profiler over wait/warmup/active steps, its trace and op tables
logged as MLflow artifacts), both in each repeat, the order alternating; busy repeats retried or dropped. Figure:
the whole run's wall time (process start to exit), median over repeats of on/off with a bootstrap 95% interval. For
reference: `cpu_time`, the same ratio of the CPU time of all the run's processes (RUSAGE_CHILDREN, less moved by
other load), and each run's mean `step_time_ms` (its metrics.json).
"""
GOAL = Goal("<=", 1.05)
ARMS = ("off", "on")


def _train(params_path: Path, data: Path, out: Path, env: dict[str, str]) -> dict[str, Any]:
    """One `scalelab train` into `out` (removed after): its wall and CPU seconds, steps and traces."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    pipeline.scalelab("train", "--params", str(params_path), "--data", str(data), "--out", str(out), env=env)
    wall_s, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)  # ranks included
    metrics = json.loads((out / "metrics.json").read_text())
    traces = [p.stat().st_size for p in (out / "profile").glob("trace-rank*.json.gz")]
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall_s": wall_s, "cpu_s": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
        "step_time_ms": metrics.get("step_time_ms"), "steps": metrics["steps"], "trace_bytes": sum(traces),
        "traces": len(traces),
    }  # fmt: skip


def measure(ctx: harness.Context) -> dict[str, Any]:
    args, work = ctx.args, ctx.work
    raw = pipeline.params_tree(args.params, args.sets)
    if raw["train"].get("launcher", "local") != "local":
        raise ConfigError("train.launcher: the profiler benchmark times local runs; use --set train.launcher=local")
    data = pipeline.prepare_data(raw, work / "prepared")
    trees = {arm: apply(raw, {"train.profile.enabled": arm == "on"}) for arm in ARMS}
    paths = {arm: pipeline.write_params(work / f"params-{arm}.yaml", trees[arm]) for arm in ARMS}
    env = pipeline.store_env(work, tracking=raw["tracking"].get("enabled", True))

    def take(rep: int) -> dict[str, Any]:  # one repeat: both arms, the order alternating
        return {arm: _train(paths[arm], data, work / f"train-{arm}-{rep}", env) for arm in harness.rotated(ARMS, rep)}

    reps = harness.take_repeats(take, ctx.policy())
    runs = {arm: [r[arm] for r in reps.kept] for arm in ARMS}
    wall, cpu = ({arm: [r[key] for r in runs[arm]] for arm in ARMS} for key in ("wall_s", "cpu_s"))
    ratio, train = stats.ratio_figures(wall["on"], wall["off"]), pipeline.parsed(raw).train
    result = {
        "params": str(args.params), "overrides": list(args.sets),
        "train": {**{k: getattr(train, k) for k in ("strategy", "nproc_per_node", "epochs", "batch_size")},
                  "profile": {k: getattr(train.profile, k) for k in ("wait", "warmup", "active")}},
        "repeats": args.repeats, **ratio, "median_wall_s": {arm: stats.median(wall[arm]) for arm in ARMS},
        "cpu_time": stats.ratio_figures(cpu["on"], cpu["off"]),  # less moved by other load than wall time
        "median_cpu_s": {arm: stats.median(cpu[arm]) for arm in ARMS}, "runs": runs, **reps.json(),
    }  # fmt: skip
    med = result["median_wall_s"]
    inner = f"; off {med['off']:.1f} s, on {med['on']:.1f} s; CPU time on/off {result['cpu_time']['median_ratio']:.3f}"
    text = f"whole-run wall time profile on/off {stats.ratio_text(ratio, inner=inner)}"
    ctx.figure("profiler_overhead", text, ratio["median_ratio"], GOAL, dropped=reps.dropped)
    return result


OPTIONS = (
    opt("--params", "params.yaml", "the params to train with"),
    opt("--repeats", 3, "training runs per arm, profiler on and off"),
    pipeline.SET_OPTION,
)
BENCH = harness.Benchmark("profiler", "profiler_overhead.json", METHOD, measure, OPTIONS, key="profiler_overhead")
