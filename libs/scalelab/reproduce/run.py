"""`scalelab reproduce RUN_ID`: rerun a tracked training run from its provenance and compare.

    scalelab reproduce 3f2a9c...                  # in the repository that holds the run's store
    scalelab reproduce 3f2a9c... --data /shared/prepared --keep

1. Reads the run from the MLflow store (`MLFLOW_TRACKING_URI`, else the lab's server named in
   `.scalelab.local.yaml`, else mlflow.db at the repo root).
2. Gets the data: without --data, a clone that lacks the run's data folder and has a store (DVC's
   default remote) pulls it with `dvc pull <data.path>`. Verifies the data before anything runs:
   every file of the recorded data folder (`data.path`, or `--data`) must have the sha256 recorded
   in the run's `data.sha256.<file>` tags (the same figures as `provenance/data-files.json`), and
   the folder's DVC md5 (`data.md5`, the value dvc.lock holds for it) must match too, so an added
   or removed file is caught as well.
3. Trusts nothing it read (`scalelab.reproduce.guard`): a run tagged not reproducible (its diff
   held a secret, or was too large) is refused; `git.commit` must be a commit in this repository,
   and one that no trusted ref holds is shown and needs --yes; each recorded diff must have its
   recorded sha256 and may change regular files inside the worktree only (no symlinks, mode
   changes, absolute or `..` paths). It prints what it will apply (files, +/- lines), and needs
   --yes (or a "y" on a terminal) when that changes code (every file but params, docs and raw
   data). Then it checks out the commit into a temporary git worktree and applies
   `provenance/dirty.diff` and `provenance/untracked.diff`, if any.
4. Writes the recorded `config.json`, checked against its recorded sha256 and the run's logged
   params, as the worktree's params.yaml (`train.launcher: local`, the SLURM folder inside the
   temporary folder) and runs that code's `scalelab train` (and `scalelab evaluate` when the run
   has test metrics) on the verified data, logging into the same store. The new run is named
   `reproduce-<original run name>` and tagged `scalelab.kind=reproduce` and
   `scalelab.reproduces=<RUN_ID>`.
5. Compares, and prints a table: every param and seed; every metric's full history, step by step,
   bitwise on CPU (within --rtol/--atol on CUDA); the final weights' sha256 (`weights.sha256`).
   Timing and system metrics (samples_per_s, step_time_ms and their mean_ run figures,
   profile_trace_bytes, system/...) are not expected to repeat and are listed as skipped.

Exit status: 0 when everything compared matches; 1 on a mismatch (data hash, param, metric,
weights); 2 when the run cannot be reproduced (unknown run, no provenance, a refused commit or diff,
no --yes, git or training failed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from scalelab.reproduce.compare import Check, compare_metrics, compare_params, compare_weights, on_gpu, short, table
from scalelab.reproduce.guard import (
    CannotReproduce,
    FileChange,
    check_commit,
    check_patch,
    confirm,
    parse_diff,
    safe_relative,
    summary,
    untrusted_commit,
    verify_diff,
    write_file,
)
from scalelab.runtime.paths import repo_root
from scalelab.tracking import provenance, tracking_uri
from scalelab.tracking.secrets import mask_uri

__all__ = ["CannotReproduce", "reproduce", "report", "write_params"]
DIFFS = ("provenance/dirty.diff", "provenance/untracked.diff")


def verify_data(tags: dict[str, str], data_dir: Path) -> list[Check]:
    """Recorded sha256 of every file and DVC md5 of the folder against the files now."""
    recorded = {k.removeprefix("data.sha256."): v for k, v in tags.items() if k.startswith("data.sha256.")}
    if not recorded or "data.md5" not in tags:
        raise CannotReproduce("the run records no data hashes (data.sha256.*, data.md5): it predates them")
    hashes = provenance.file_hashes(data_dir) if data_dir.is_dir() else {}
    checks = []
    for name in sorted(set(recorded) | set(hashes)):
        old, new = recorded.get(name, "(absent)"), hashes[name][1] if name in hashes else "(absent)"
        checks.append(
            Check(f"data {data_dir.name}/{name} sha256", short(old), short(new), "match" if old == new else "MISMATCH")
        )
    md5 = provenance.dvc_dir_md5(hashes) if hashes else "(absent)"
    checks.append(
        Check(
            f"data {data_dir.name} dvc md5", tags["data.md5"], md5, "match" if md5 == tags["data.md5"] else "MISMATCH"
        )
    )
    return checks


def pull_data(root: Path, folder: Path) -> None:
    """`dvc pull FOLDER` from the lab's store when this clone has one (DVC's default remote) and
    lacks the run's data: the data comes back by the hashes dvc.lock records, and `verify_data`
    then checks it against the run's own. Without a store this does nothing."""
    from scalelab.storage import configured

    store = configured(root)
    if store is None:
        return
    store.check()  # StoreError (exit 2): one line naming the store, before anything runs
    print(f"pulling {folder} from the store {store.describe()} (dvc pull)", file=sys.stderr, flush=True)
    dvc = Path(sys.executable).with_name("dvc")
    cmd = [str(dvc) if dvc.is_file() else "dvc", "pull", "--quiet", str(folder)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        why = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()[-1]
        raise CannotReproduce(f"`dvc pull {folder}` from the store {store.describe()} failed: {mask_uri(why)}")


def fetch_diffs(client: Any, run_id: str, tags: dict[str, str], dest: Path) -> list[tuple[Path, list[FileChange]]]:
    """The run's diffs, downloaded, hash-verified and checked, with the files each one changes."""
    diffs = []
    for name in DIFFS:
        patch = _download(client, run_id, name, dest)
        blob = verify_diff(tags, Path(name).name, patch)
        if blob is not None and patch is not None:
            diffs.append((patch, parse_diff(blob, Path(name).name)))
    return diffs


def checkout(root: Path, commit: str, dest: Path, diffs: list[tuple[Path, list[FileChange]]]) -> list[str]:
    """A detached worktree of `commit` at `dest`, with the checked diffs applied; returns their names."""
    _git(root, "worktree", "add", "--detach", "--", str(dest), commit)
    for patch, changes in diffs:
        check_patch(root, patch, changes, dest)
        _git(dest, "apply", "--binary", "--whitespace=nowarn", "--end-of-options", str(patch))
    return [patch.name for patch, _ in diffs]


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


def write_params(client: Any, run: Any, worktree: Path, out: Path) -> None:
    """The recorded config.json as the worktree's params.yaml, once it is verified: its sha256 is the
    run's `provenance.config.sha256`, and every value equals the run's logged params (which MLflow
    never lets change). The job runs here (`train.launcher: local`), its SLURM folder under `out`."""
    path = _download(client, run.info.run_id, "config.json", worktree.parent)
    if path is None:
        raise CannotReproduce("the run has no config.json artifact")
    blob, recorded = path.read_bytes(), run.data.tags.get("provenance.config.sha256")
    digest = hashlib.sha256(blob).hexdigest()
    if recorded and digest != recorded:
        raise CannotReproduce(
            f"config.json has sha256 {digest}, but provenance.config.sha256 = {recorded}: the stored config was changed"
        )
    config = json.loads(blob)
    check_config(config, run.data.params, run.data.tags)
    config.get("tracking", {}).pop("run_id", None)
    config["train"]["launcher"] = "local"
    config["train"]["checkpoint_dir"] = ""  # its own, under `out`: never the original's (in the store)
    config.setdefault("slurm", {})["folder"] = str(out / "slurm")
    write_file(worktree, "params.yaml", yaml.safe_dump(config, sort_keys=False))


def check_config(config: dict[str, Any], params: dict[str, str], tags: dict[str, str]) -> None:
    """Every value of config.json (but the study's section, which training does not log) is the
    logged param, or, for a key that may change on resume, its `resumed.<key>` tag."""
    from scalelab.config import flatten
    from scalelab.training.checkpoint import CADENCE_KEYS

    for key, value in flatten({k: v for k, v in config.items() if k != "speedup"}).items():
        logged = params.get(key)
        resumed = key.startswith("train.") and key.split(".")[1] in CADENCE_KEYS and tags.get(f"resumed.{key}")
        if logged != str(value) and resumed != str(value):
            raise CannotReproduce(
                f"config.json sets {key} = {short(str(value))}, but the run logged {short(str(logged))}: "
                "the stored config was changed"
            )


def rerun(worktree: Path, data_dir: Path, out: Path, evaluate: bool) -> str:
    """Runs the worktree's `scalelab train` (and evaluate); returns the new run id."""
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking_uri(),
        "PYTHONPATH": os.pathsep.join([str(worktree / "libs"), str(worktree), os.environ.get("PYTHONPATH", "")]),
    }
    base = [sys.executable, "-m", "scalelab.cli"]
    steps = [["train", "--params", "params.yaml", "--data", str(data_dir), "--out", str(out)]]
    if evaluate:
        steps.append(
            [
                "evaluate",
                "--params",
                "params.yaml",
                "--data",
                str(data_dir),
                "--train",
                str(out),
                "--out",
                str(out / "eval.json"),
            ]
        )
    for args in steps:
        code = subprocess.run(base + args, cwd=worktree, env=env, stdout=sys.stderr).returncode  # stdout: the table
        if code != 0:
            raise CannotReproduce(f"`scalelab {args[0]}` in the worktree exited with {code}")
    return json.loads((out / "run.json").read_text())["run_id"]


def reproduce(run_id: str, *, data: str | None, keep: bool, rtol: float, atol: float, yes: bool = False) -> list[Check]:
    """Verifies, reruns and compares; returns the checks (data mismatches stop before training)."""
    from scalelab.tracking import runs

    client = runs.client()
    try:
        old = client.get_run(run_id)
    except Exception as exc:
        raise CannotReproduce(f"run {run_id} is not in {mask_uri(tracking_uri())}: {mask_uri(str(exc))}") from None
    if old.data.tags.get("scalelab.reproducible") == "false":
        why = old.data.tags.get("scalelab.not_reproducible", "its provenance is incomplete")
        raise CannotReproduce(f"run {run_id} was tagged not reproducible when it ran: {why}")
    root = repo_root()
    recorded = old.data.tags.get("data.path", "data/prepared")
    try:
        data_dir = Path(data) if data else root / safe_relative(recorded, "data.path")
    except CannotReproduce:
        raise CannotReproduce(
            f"data.path = {recorded!r} is not allowed: the run's data must be a relative path inside "
            "the repository; pass --data FOLDER to name it"
        ) from None
    if not data_dir.is_dir() and not data:
        pull_data(root, data_dir.relative_to(root))
    if not data_dir.is_dir():
        how = "--data" if data else f"the run's data.path {old.data.tags.get('data.path')!r} under {root}"
        raise CannotReproduce(
            f"the data folder {data_dir} ({how}) does not exist: run `dvc repro prepare` here, or pass --data"
        )
    checks = verify_data(old.data.tags, data_dir.resolve())
    if any(c.status == "MISMATCH" for c in checks):
        return checks
    commit = check_commit(root, old.data.tags.get("git.commit", ""))
    foreign = untrusted_commit(root, commit)
    refused = False
    tmp = Path(tempfile.mkdtemp(prefix="scalelab-reproduce-"))
    worktree = tmp / "src"
    try:
        diffs = fetch_diffs(client, run_id, old.data.tags, tmp)
        print(f"will check out {commit}" + ("" if diffs else " (no recorded diff)"))
        if foreign is not None:
            print(f"commit {commit[:12]} is on no trusted branch or tag; what it adds to HEAD:\n{foreign}")
        for patch, changes in diffs:
            print(summary(patch.name, changes))
        sys.stdout.flush()
        try:
            confirm(
                [c for _, changes in diffs for c in changes],
                yes,
                sys.stdin.isatty() and sys.stderr.isatty(),
                commit=commit if foreign is not None else None,
                kept=tmp if diffs else None,
            )
        except CannotReproduce:
            refused = bool(diffs)  # the downloaded diffs stay in `tmp` to be read
            raise
        applied = checkout(root, commit, worktree, diffs)
        checks.append(
            Check(
                "code",
                short(old.data.tags["git.commit"][:12]),
                "worktree" + (f" + {', '.join(applied)}" if applied else ""),
                "match",
            )
        )
        write_params(client, old, worktree, tmp)
        evaluate = any(k.startswith("test_") for k in old.data.metrics)
        new_id = rerun(worktree, data_dir.resolve(), tmp / "results", evaluate)
        client.update_run(new_id, name=f"reproduce-{old.info.run_name}")
        client.set_tag(new_id, "scalelab.kind", "reproduce")
        client.set_tag(new_id, "scalelab.reproduces", run_id)
        new = client.get_run(new_id)
        cuda = on_gpu(old, new)
        rtol, atol = (rtol, atol) if cuda else (0.0, 0.0)
        checks += compare_params(old, new) + compare_metrics(client, old, new, rtol, atol)
        checks.append(compare_weights(old, new, cuda))
        checks.append(Check("new run", run_id, new_id, "skipped: for reference"))
    finally:
        if keep:
            print(f"kept the worktree and outputs in {tmp}", file=sys.stderr)
        elif not refused:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=root, capture_output=True)
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)
    return checks


def report(checks: list[Check]) -> bool:
    """Prints the table and the verdict; returns True when everything compared matches."""
    print(table(checks))
    bad = [c for c in checks if c.status == "MISMATCH"]
    if bad:
        kind = "data hash mismatch" if any(c.name.startswith("data ") for c in bad) else "mismatch"
        print(f"RESULT: {kind}: {', '.join(c.name for c in bad)}")
        return False
    print(f"RESULT: match ({sum(c.status == 'match' for c in checks)} checks match)")
    return True
