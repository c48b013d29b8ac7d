"""Cached and incremental `dvc repro`: the no-op time, and the time after one evaluate param change.

    scalelab bench dvc --out results/bench     # -> results/bench/dvc.json

The method is METHOD below; the JSON file carries it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from scalelab.bench import stats
from scalelab.config.overrides import apply, parse_overrides
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.paths import PACKAGE_ROOT

METHOD = """\
A temporary copy of the repository's files (tracked and untracked, not ignored: no results, no
data/prepared, no mlflow.db), committed into a fresh git repository, with its own SQLite MLflow
store. Its params.yaml is shrunk by `--set` (by default: 2 training epochs and a one-cell speedup
study, so that the first full `dvc repro` takes seconds, not minutes; every stage, dep and out of
dvc.yaml stays). After that first repro (not timed), `no-op`: `--repeats` runs of `dvc repro`
with nothing changed, each one's wall time from process start to exit, as a user sees it; the
first of them is also reported alone (`first_noop_s`: DVC may still be filling its hash cache).
`incremental`: `--incremental-repeats` times, `--param` (evaluate.batch_size) is set to a value it
never had (half, then half minus 1, ...: an old value would come from DVC's run cache) and
`dvc repro` runs; its wall time, and which stages ran (from DVC's "Running stage" lines: the goal
is that exactly `--stage` does).
"""
OUT_FILE = "dvc.json"
TARGET_NOOP_S = 2.0
DEFAULT_SETS = [
    "train.epochs=2",
    "speedup.strategies=[single]",
    "speedup.world_sizes=[1]",
    "speedup.batch_sizes=[256]",
    "speedup.warmup_steps=1",
    "speedup.timed_steps=1",
    "speedup.repeats=1",
]
RUNNING = re.compile(r"Running stage '([^']+)'")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", default=str(PACKAGE_ROOT), help="the repository to copy")
    parser.add_argument("--repeats", type=int, default=5, help="no-op repros")
    parser.add_argument(
        "--incremental-repeats", type=int, default=2, help="repros after a change of --param (default: 2)"
    )
    parser.add_argument("--param", default="evaluate.batch_size", help="the int param to change")
    parser.add_argument("--stage", default="evaluate", help="the one stage that --param should rerun")
    parser.add_argument(
        "--set", dest="sets", action="append", default=None, metavar="KEY=VALUE", help=f"default: {DEFAULT_SETS}"
    )


def copy_repo(repo: Path, dest: Path) -> Path:
    """The files git would commit (tracked and untracked, not ignored), in a fresh repository."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for rel in filter(None, files):
        if (repo / rel).is_file() and not (repo / rel).is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / rel, dest / rel)
    return dest


def _git(dest: Path, *args: str) -> None:
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, *args], cwd=dest, check=True, capture_output=True)


def _edit_params(dest: Path, values: dict[str, Any]) -> None:
    path = dest / "params.yaml"
    path.write_text(yaml.safe_dump(apply(yaml.safe_load(path.read_text()), values), sort_keys=False))


def _get(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


class Repro:
    """`dvc repro` in the copy, with this venv's tools first on PATH and the copy's own store."""

    def __init__(self, dest: Path) -> None:
        bin_dir = str(Path(sys.executable).parent)
        self.dest, self.dvc = dest, str(Path(bin_dir) / "dvc")
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
            "MLFLOW_TRACKING_URI": f"sqlite:///{dest / 'mlflow.db'}",
        }

    def __call__(self) -> tuple[float, list[str]]:
        """Runs `dvc repro`; returns (wall seconds, stages that ran)."""
        start = time.perf_counter()
        proc = subprocess.run([self.dvc, "repro"], cwd=self.dest, env=self.env, capture_output=True, text=True)
        wall_s = time.perf_counter() - start
        if proc.returncode != 0:
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
            raise RuntimeError(f"dvc repro in {self.dest} exited {proc.returncode}: {tail[-800:]}")
        return wall_s, RUNNING.findall(proc.stdout + proc.stderr)


def measure(args: argparse.Namespace, dest: Path) -> dict[str, Any]:
    copy_repo(Path(args.repo), dest)
    sets = DEFAULT_SETS if args.sets is None else args.sets
    _edit_params(dest, {k: v[0] for k, v in parse_overrides(sets).items()})
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-qm", "bench copy")
    repro = Repro(dest)
    first_s, first_stages = repro()  # the whole pipeline, not timed
    noop = [repro() for _ in range(args.repeats)]
    base = _get(yaml.safe_load((dest / "params.yaml").read_text()), args.param)
    incremental = []
    for i in range(args.incremental_repeats):
        value = max(1, base // 2 - i)  # a new value each time: DVC's run cache restores an old one
        _edit_params(dest, {args.param: value})
        wall_s, ran = repro()
        incremental.append({"wall_s": wall_s, "stages": ran, "value": value})
    return {
        "sets": sets,
        "first_repro": {"wall_s": first_s, "stages": first_stages},
        "noop": [{"wall_s": s, "stages": ran} for s, ran in noop],
        "incremental": incremental,
    }


def summarize(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    noop_s = [r["wall_s"] for r in raw["noop"]]
    inc_s = [r["wall_s"] for r in raw["incremental"]]
    noop_median = stats.median(noop_s)
    only_stage = all(r["stages"] == [args.stage] for r in raw["incremental"])
    return {
        "benchmark": "dvc",
        "method": METHOD.strip(),
        "overrides": raw["sets"],
        "first_repro": raw["first_repro"],
        "noop_median_s": noop_median,
        "noop_max_s": max(noop_s),
        "first_noop_s": noop_s[0],
        "noop_s": noop_s,
        "noop_ran_nothing": all(not r["stages"] for r in raw["noop"]),
        "incremental_param": args.param,
        "incremental_stage": args.stage,
        "incremental_median_s": stats.median(inc_s),
        "incremental": raw["incremental"],
        "incremental_only_stage": only_stage,
        "target_noop_s": TARGET_NOOP_S,
        "meets_target": noop_median <= TARGET_NOOP_S,
        **stats.machine(),
    }


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Measures in a temporary copy, writes dvc.json and two summary lines; returns the result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="scalelab-bench-dvc-"))
    try:
        result = summarize(measure(args, work / "repo"), args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    atomic_write_json(out_dir / OUT_FILE, result)
    noop_ok = result["meets_target"] and result["noop_ran_nothing"]
    figure = f"no-op dvc repro {result['noop_median_s']:.2f} s median (max {result['noop_max_s']:.2f} s)"
    stats.write_summary_line(out_dir, "dvc_noop", figure, f"<= {TARGET_NOOP_S:.0f} s, nothing rerun", noop_ok)
    ran = sorted({s for r in result["incremental"] for s in r["stages"]})
    figure = (
        f"dvc repro after one {args.param} change {result['incremental_median_s']:.2f} s median, "
        f"stages run: {', '.join(ran) or 'none'}"
    )
    stats.write_summary_line(
        out_dir, "dvc_incremental", figure, f"reruns only {args.stage}", result["incremental_only_stage"]
    )
    return result


def headline(result: dict, out: Path) -> str:
    ran = sorted({s for r in result["incremental"] for s in r["stages"]})
    return (
        f"dvc repro: no-op {result['noop_median_s']:.2f} s median (max {result['noop_max_s']:.2f} s); after one "
        f"{result['incremental_param']} change {result['incremental_median_s']:.2f} s, "
        f"ran {', '.join(ran) or 'nothing'} -> {out / OUT_FILE}"
    )
