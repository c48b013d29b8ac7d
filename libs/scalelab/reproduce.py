"""`scalelab reproduce RUN_ID`: rerun a tracked training run from its provenance and compare.

    scalelab reproduce 3f2a9c...                  # in the repository that holds the run's store
    scalelab reproduce 3f2a9c... --data /shared/prepared --keep

1. Reads the run from the MLflow store (`MLFLOW_TRACKING_URI`, else mlflow.db at the repo root).
2. Verifies the data before anything runs: every file of the recorded data folder (`data.path`,
   or `--data`) must have the sha256 recorded in the run's `data.sha256.<file>` tags (the same
   figures as `provenance/data-files.json`), and the folder's DVC md5 (`data.md5`, the value
   dvc.lock holds for it) must match too, so an added or removed file is caught as well.
3. Checks out the run's commit into a temporary git worktree and applies the recorded
   `provenance/dirty.diff` and `provenance/untracked.diff`, if any.
4. Writes the recorded `config.json` as the worktree's params.yaml and runs that code's
   `scalelab train` (and `scalelab evaluate` when the run has test metrics) on the verified data,
   logging into the same store. The new run is tagged `scalelab.kind=reproduce` and
   `scalelab.reproduces=<RUN_ID>`.
5. Compares, and prints a table: every param and seed; every metric's full history, step by step,
   bitwise on CPU (within --rtol/--atol on CUDA); the final weights' sha256 (`weights.sha256`).
   Timing and system metrics (samples_per_s, step_time_ms, profile_trace_bytes, system/...) are
   not expected to repeat and are listed as skipped.

Exit status: 0 when everything compared matches; 1 on a mismatch (data hash, param, metric,
weights); 2 when the run cannot be reproduced (unknown run, no provenance, git or training failed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scalelab import provenance, tracking

TIMING_METRICS = ("samples_per_s", "step_time_ms", "profile_trace_bytes")
IGNORED_PARAMS = ("tracking.run_id",)  # a sweep's pre-made run: the reproduction gets its own
EXIT_MISMATCH, EXIT_CANNOT = 1, 2


class CannotReproduce(RuntimeError):
    """The run lacks what reproducing needs, or a step (git, training) failed."""


@dataclass(frozen=True)
class Check:
    name: str
    original: str
    reproduced: str
    status: str  # "match", "MISMATCH" or "skipped: <why>"


def _short(value: Any, width: int = 24) -> str:
    text = str(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def verify_data(tags: dict[str, str], data_dir: Path) -> list[Check]:
    """Recorded sha256 of every file and DVC md5 of the folder against the files now."""
    recorded = {k.removeprefix("data.sha256."): v for k, v in tags.items() if k.startswith("data.sha256.")}
    if not recorded or "data.md5" not in tags:
        raise CannotReproduce("the run records no data hashes (data.sha256.*, data.md5): it predates them")
    hashes = provenance.file_hashes(data_dir) if data_dir.is_dir() else {}
    checks = []
    for name in sorted(set(recorded) | set(hashes)):
        old, new = recorded.get(name, "(absent)"), hashes[name][1] if name in hashes else "(absent)"
        checks.append(Check(f"data {data_dir.name}/{name} sha256", _short(old), _short(new),
                            "match" if old == new else "MISMATCH"))
    md5 = provenance.dvc_dir_md5(hashes) if hashes else "(absent)"
    checks.append(Check(f"data {data_dir.name} dvc md5", tags["data.md5"], md5,
                        "match" if md5 == tags["data.md5"] else "MISMATCH"))
    return checks


def checkout(root: Path, commit: str, dest: Path, client: Any, run_id: str) -> list[str]:
    """A detached worktree of `commit` at `dest`, with the run's diffs applied; returns their names."""
    if len(commit) != 40:
        raise CannotReproduce(f"the run records no git commit (git.commit = {commit!r})")
    _git(root, "worktree", "add", "--detach", str(dest), commit)
    applied = []
    for name in ("provenance/dirty.diff", "provenance/untracked.diff"):
        patch = _download(client, run_id, name, dest.parent)
        if patch is not None:
            _git(dest, "apply", "--binary", "--whitespace=nowarn", str(patch))
            applied.append(Path(name).name)
    return applied


def _git(cwd: Path, *args: str) -> None:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CannotReproduce(f"git {' '.join(args[:2])} failed in {cwd}: {proc.stderr.strip()}")


def _download(client: Any, run_id: str, name: str, dest: Path) -> Path | None:
    """Downloads one artifact, or None if the run has no such artifact."""
    folder = str(Path(name).parent)
    listed = client.list_artifacts(run_id, folder if folder != "." else None)
    if Path(name).name not in {Path(a.path).name for a in listed}:
        return None
    return Path(client.download_artifacts(run_id, name, str(dest)))


def write_params(client: Any, run_id: str, worktree: Path) -> None:
    """The recorded config.json (every section, typed values) as the worktree's params.yaml."""
    path = _download(client, run_id, "config.json", worktree.parent)
    if path is None:
        raise CannotReproduce("the run has no config.json artifact")
    config = json.loads(path.read_text())
    config.get("tracking", {}).pop("run_id", None)
    (worktree / "params.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def rerun(worktree: Path, data_dir: Path, out: Path, evaluate: bool) -> str:
    """Runs the worktree's `scalelab train` (and evaluate); returns the new run id."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking.tracking_uri(),
           "PYTHONPATH": os.pathsep.join([str(worktree / "libs"), str(worktree), os.environ.get("PYTHONPATH", "")])}
    base = [sys.executable, "-m", "scalelab.cli"]
    steps = [["train", "--params", "params.yaml", "--data", str(data_dir), "--out", str(out)]]
    if evaluate:
        steps.append(["evaluate", "--params", "params.yaml", "--data", str(data_dir), "--train", str(out),
                      "--out", str(out / "eval.json")])
    for args in steps:
        code = subprocess.run(base + args, cwd=worktree, env=env, stdout=sys.stderr).returncode  # stdout: the table
        if code != 0:
            raise CannotReproduce(f"`scalelab {args[0]}` in the worktree exited with {code}")
    return json.loads((out / "run.json").read_text())["run_id"]


def _history(client: Any, run_id: str, key: str) -> dict[int, float]:
    history = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return {m.step: m.value for m in history}  # a step logged twice: the later value


def _same(a: float, b: float, rtol: float, atol: float) -> bool:
    if a != a or b != b:  # NaN
        return a != a and b != b
    return a == b if rtol == 0 and atol == 0 else abs(a - b) <= atol + rtol * abs(b)


def compare_metrics(client: Any, old: Any, new: Any, rtol: float, atol: float) -> list[Check]:
    """Every metric's whole history, step by step; timing and system metrics are skipped."""
    checks = []
    for key in sorted(old.data.metrics):
        if key.startswith("system/") or key in TIMING_METRICS:
            checks.append(Check(f"metric {key}", _short(old.data.metrics[key]),
                                _short(new.data.metrics.get(key, "(absent)")), "skipped: timing/system"))
            continue
        a, b = _history(client, old.info.run_id, key), _history(client, new.info.run_id, key)
        ok = a.keys() == b.keys() and all(_same(a[s], b[s], rtol, atol) for s in a)
        last = max(a) if a else None
        checks.append(Check(f"metric {key} ({len(a)} steps)", repr(a.get(last)), repr(b.get(last, "(absent)")),
                            "match" if ok else "MISMATCH"))
    return checks


def compare_params(old: Any, new: Any) -> list[Check]:
    """Every param, seeds included (seed.base, seed.rank.N, the rules, the deterministic flag)."""
    keys = sorted((set(old.data.params) | set(new.data.params)) - set(IGNORED_PARAMS))
    differ = [k for k in keys if old.data.params.get(k) != new.data.params.get(k)]
    seeds = [k for k in keys if k.startswith("seed.")]
    checks = [Check(f"param {k}", _short(old.data.params.get(k)), _short(new.data.params.get(k)), "MISMATCH")
              for k in differ]
    checks.append(Check(f"params ({len(keys)}, {len(seeds)} seed entries)", f"{len(keys)} recorded",
                        f"{len(keys) - len(differ)} equal", "match" if not differ else "MISMATCH"))
    return checks


def compare_weights(old: Any, new: Any, on_gpu: bool) -> Check:
    a, b = old.data.tags.get("weights.sha256"), new.data.tags.get("weights.sha256")
    if a is None:
        return Check("weights sha256", "(not recorded)", _short(b), "skipped: not recorded by the run")
    if a != b and on_gpu:
        return Check("weights sha256", _short(a), _short(b), "skipped: GPU runs are compared by metrics")
    return Check("weights sha256", _short(a), _short(b), "match" if a == b else "MISMATCH")


def reproduce(run_id: str, *, data: str | None, keep: bool, rtol: float, atol: float) -> list[Check]:
    """Verifies, reruns and compares; returns the checks (data mismatches stop before training)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking.tracking_uri())
    try:
        old = client.get_run(run_id)
    except Exception as exc:
        raise CannotReproduce(f"run {run_id} is not in {tracking.tracking_uri()}: {exc}") from None
    root = tracking.repo_root()
    data_dir = Path(data) if data else root / old.data.tags.get("data.path", "data/prepared")
    checks = verify_data(old.data.tags, data_dir.resolve())
    if any(c.status == "MISMATCH" for c in checks):
        return checks
    tmp = Path(tempfile.mkdtemp(prefix="scalelab-reproduce-"))
    worktree = tmp / "src"
    try:
        applied = checkout(root, old.data.tags.get("git.commit", ""), worktree, client, run_id)
        checks.append(Check("code", _short(old.data.tags["git.commit"][:12]), "worktree" + (
            f" + {', '.join(applied)}" if applied else ""), "match"))
        write_params(client, run_id, worktree)
        evaluate = any(k.startswith("test_") for k in old.data.metrics)
        new_id = rerun(worktree, data_dir.resolve(), tmp / "results", evaluate)
        client.set_tag(new_id, "scalelab.kind", "reproduce")
        client.set_tag(new_id, "scalelab.reproduces", run_id)
        new = client.get_run(new_id)
        on_gpu = old.data.tags.get("scalelab.device") == "cuda"
        rtol, atol = (rtol, atol) if on_gpu else (0.0, 0.0)
        checks += compare_params(old, new) + compare_metrics(client, old, new, rtol, atol)
        checks.append(compare_weights(old, new, on_gpu))
        checks.append(Check("new run", run_id, new_id, "skipped: for reference"))
    finally:
        if keep:
            print(f"kept the worktree and outputs in {tmp}", file=sys.stderr)
        else:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=root, capture_output=True)
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)
    return checks


def table(checks: list[Check]) -> str:
    """The checks as an aligned text table."""
    rows = [("check", "original", "reproduced", "result")]
    rows += [(c.name, c.original, c.reproduced, c.status) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `scalelab reproduce`; returns the exit status (0 match, 1 mismatch, 2 error)."""
    parser = argparse.ArgumentParser(prog="scalelab reproduce", description=__doc__.split("\n")[0])
    parser.add_argument("run_id")
    parser.add_argument("--data", help="the prepared-data folder (default: the run's data.path under the repo root)")
    parser.add_argument("--keep", action="store_true", help="keep the worktree and the new outputs")
    parser.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance for CUDA runs (CPU: bitwise)")
    parser.add_argument("--atol", type=float, default=1e-7, help="absolute tolerance for CUDA runs (CPU: bitwise)")
    args = parser.parse_args(argv)
    try:
        checks = reproduce(args.run_id, data=args.data, keep=args.keep, rtol=args.rtol, atol=args.atol)
    except CannotReproduce as exc:
        print(f"scalelab reproduce: error: {exc}", file=sys.stderr)
        return EXIT_CANNOT
    print(table(checks))
    bad = [c for c in checks if c.status == "MISMATCH"]
    if bad:
        kind = "data hash mismatch" if any(c.name.startswith("data ") for c in bad) else "mismatch"
        print(f"RESULT: {kind}: {', '.join(c.name for c in bad)}")
        return EXIT_MISMATCH
    print(f"RESULT: match ({sum(c.status == 'match' for c in checks)} checks match)")
    return 0
