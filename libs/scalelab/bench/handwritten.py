"""The hand-written job beside `scalelab train`: `benchmarks/handwritten_ddp.py` under torchrun.

`scalelab bench startup` runs it and `scalelab train` in interleaved pairs (the order alternates
from pair to pair) on the same machine, data size, model, optimizer, epochs and MLflow store, and
compares their end-to-end wall time and their time to the first step (rank 0, from the process
start). The script is defined for the default job only (the mlp workload, ddp, digits); for any
other params the comparison is not measured, and says why.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scalelab.bench import stats
from scalelab.bench.stats import Goal
from scalelab.config import strategies
from scalelab.runtime.paths import PACKAGE_ROOT

SCRIPT = PACKAGE_ROOT / "benchmarks" / "handwritten_ddp.py"
GOALS = {
    "wall": Goal("<=", 1.10, "<= 1.10"),
    "first_step": Goal("<=", 1.5, "<= 1.50"),
}  # scalelab / hand-written (issue 22)


def training_split(params: dict[str, Any], path: Path) -> Path:
    """The script's data: digits split with the train fraction `prepare` uses, as one tensor file."""
    import torch
    from sklearn.datasets import load_digits

    data = params["data"]
    x, y = load_digits(return_X_y=True)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(data.get("seed", 0)))
    held_out = round(data.get("test_fraction", 0.2) * len(x)) + round(data.get("val_fraction", 0.1) * len(x))
    train = order[: len(x) - held_out]
    torch.save({"x": torch.tensor(x[train] / 16.0, dtype=torch.float32), "y": torch.tensor(y[train])}, path)
    return path


def command(params: dict[str, Any], split: Path) -> tuple[list[str] | None, str]:
    """The torchrun command for the params' train section, or (None, why it does not apply)."""
    train = params["train"]
    wanted = {"workload": "mlp", "launcher": "local", "grad_accum_steps": 1, "num_nodes": 1}
    off = {k: train.get(k) for k, v in wanted.items() if train.get(k, v) != v}
    kind = strategies.get(train.get("strategy", "ddp"))
    if not kind.distributed or kind.sharded:  # the script wraps the model in DDP
        off["strategy"] = train.get("strategy")
    if params["data"].get("source", "digits") != "digits":
        off["data.source"] = params["data"]["source"]
    if off or train.get("optimizer", "adamw") != "adamw" or train.get("precision", "fp32") != "fp32":
        return None, f"the hand-written script is the default job (mlp, ddp, digits, adamw, fp32); these differ: {off}"
    model = train.get("model", {})
    return [  # plain torchrun, as its user would type it (not scalelab's launcher: this is the other arm)
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={train['nproc_per_node']}",
        str(SCRIPT),
        f"--data={split}",
        f"--epochs={train['epochs']}",
        f"--batch-size={train['batch_size']}",
        f"--lr={train['lr']}",
        f"--dropout={model.get('dropout', 0.1)}",
        "--hidden",
        *[str(h) for h in model.get("hidden", [256, 256])],
    ], ""


def run_once(cmd: list[str], cwd: Path, env: dict[str, str], threads: int) -> dict[str, float]:
    """One run of the script: wall time and time to its first step, in seconds from the start."""
    start = time.time()
    proc = subprocess.run(cmd, cwd=cwd, env={**env, "OMP_NUM_THREADS": str(threads)}, capture_output=True, text=True)
    end = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"the hand-written script exited with {proc.returncode}: {proc.stderr[-2000:]}")
    said = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("first_step_at", "steps")))
    return {"wall": end - start, "first_step": float(said["first_step_at"]) - start, "steps": int(said["steps"])}


def compare(ours: list[dict[str, float]], handwritten: list[dict[str, float]]) -> dict[str, Any]:
    """scalelab / hand-written for each figure, paired by repeat, with goals and verdicts.

    Raises:
        RuntimeError: the two ran a different number of steps: not the same job.
    """
    steps = {int(r["steps"]) for r in ours + handwritten}
    if len(steps) != 1:
        raise RuntimeError(f"scalelab train and the hand-written script ran {sorted(steps)} steps: not the same job")
    out: dict[str, Any] = {"script": str(SCRIPT.relative_to(PACKAGE_ROOT)), "steps": steps.pop()}
    out["goals"] = {figure: goal.target for figure, goal in GOALS.items()}
    for figure, goal in GOALS.items():
        mine, theirs = [o[figure] for o in ours], [h[figure] for h in handwritten]
        ratio = stats.ratio_figures(mine, theirs)
        out[figure] = {**ratio, "scalelab_s": mine, "handwritten_s": theirs, "met": goal.met(ratio["median_ratio"])}
    return out


def figures(ctx: Any, result: dict[str, Any] | None, reason: str, dropped: list) -> None:
    """One summary line per figure: met, not met, or not measured (with the reason)."""
    for figure, goal in GOALS.items():
        name = f"startup_vs_handwritten_{figure}"
        if result is None:
            ctx.figure(name, f"not measured: {reason}", None, goal)
            continue
        fig = result[figure]
        low, high = fig["ci95"]
        text = (
            f"scalelab train / hand-written torchrun script {figure.replace('_', ' ')} {fig['median_ratio']:.3f} "
            f"(95% CI {low:.3f}-{high:.3f}; medians {stats.median(fig['scalelab_s']):.2f} s vs "
            f"{stats.median(fig['handwritten_s']):.2f} s over {len(fig['scalelab_s'])} interleaved pairs)"
        )
        ctx.figure(name, text, fig["median_ratio"], goal, dropped=dropped)


def environment(env: dict[str, str]) -> dict[str, str]:
    """The script's environment: the bench's, without the scalelab timings file."""
    return {k: v for k, v in env.items() if k != "SCALELAB_TIMINGS"} | {"PYTHONUNBUFFERED": "1"}
