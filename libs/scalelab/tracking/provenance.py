"""Provenance: what code, data, environment and launcher produced a run.

`collect()` returns flat tags (for filtering in the UI and for `scalelab reproduce`) plus larger
texts logged as artifacts under `provenance/`. Nothing secret leaves the machine: untracked files
whose names look like secrets (`.env*`, keys, tokens, credentials) are never read, every tag and
text that is only read is redacted (`scalelab.tracking.secrets`), with the count in
`provenance.redactions`, and a diff, which `scalelab reproduce` applies, is never edited: it is
stored byte for byte with its sha256, or, when it adds a secret or is too large, not at all, and
the run is tagged `scalelab.reproducible: false` with the reason in `scalelab.not_reproducible`:

- code: `git.commit`, `git.branch`, `git.dirty` (tracked changes against HEAD), `git.untracked`;
  `dirty.diff` (tracked changes) and, only when the user opts in (`tracking.upload_untracked`),
  `untracked.diff` (new files git does not ignore: the first UNTRACKED_MAX_FILES, each up to
  UNTRACKED_MAX_BYTES), both applicable with `git apply`; without the opt-in, `untracked.txt`
  names them and a run with any is tagged not reproducible;
- data: `data.path`, `data.md5` (DVC's hash of the data folder, from every file's md5: those of
  the prepared arrays as `prepare` recorded them, so a large split is not read again at start-up),
  `data.dvc_lock_md5` (what dvc.lock records for that path), `data.sha256.<file>` for every file,
  and `data-files.json` with the same sha256 map; `params.sha256` (see `params_digest`);
- environment: Python, torch, CUDA, cuDNN and NCCL versions ("none" on a CPU build or machine),
  platform, CPU model and cores, every node's host name and GPUs (names and memory; "none"), and
  `pip-freeze.txt`;
- launcher: `launch.kind` (process | torchrun | slurm), the SLURM job id, array job and task,
  node list, torchrun's run id, nodes, restart count (SLURM or torchrun), this process's command
  line and the `scalelab` command that started the job (`launch.user_command`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from scalelab.runtime import dist
from scalelab.runtime.io import file_digests, json_digest
from scalelab.tracking.secrets import diff_findings, is_secret_file, redact

LAUNCH_VARS = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_RESTART_COUNT",
    "SLURM_NNODES",
    "SUBMITIT_FOLDER",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)
UNTRACKED_MAX_BYTES = 1 << 20
DIFF_MAX_BYTES = 8 << 20  # a larger diff is left out of the store (its size is recorded)
UNTRACKED_MAX_FILES = 200  # one `git diff` each; the count in `git.untracked` is always complete
NONE = "none"


def _git_bytes(root: Path, *args: str, ok: tuple[int, ...] = (0,)) -> bytes | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode in ok else None


def _git(root: Path, *args: str, ok: tuple[int, ...] = (0,)) -> str | None:
    out = _git_bytes(root, *args, ok=ok)
    return None if out is None else out.decode("utf-8", "replace")


def dvc_written(root: Path) -> list[str]:
    """What DVC writes while it runs the pipeline: dvc.lock and each stage's outs, metrics and plots
    in dvc.yaml. Committed ones (dvc.lock, the metrics files) change during every `dvc repro`, so
    they are the run's outputs, never part of its source: left out of the dirty flag and the diff."""
    try:
        stages = (yaml.safe_load((root / "dvc.yaml").read_text()) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        stages = {}
    paths = ["dvc.lock"]
    for stage in stages.values() if isinstance(stages, dict) else ():
        for kind in ("outs", "metrics", "plots"):
            for entry in (stage or {}).get(kind) or ():
                path = next(iter(entry)) if isinstance(entry, dict) else entry
                if isinstance(path, str) and "${" not in path:
                    paths.append(path)
    return paths


def git_info(root: Path, untracked_contents: bool = False) -> tuple[dict[str, str], dict[str, str | bytes]]:
    """Tags for commit, branch, dirty flag and untracked files, and the diffs as artifacts, as git
    wrote them (the source's: what DVC writes is left out, see `dvc_written`). Untracked files'
    contents only with `untracked_contents` (the user's opt-in), else their names."""
    commit = (_git(root, "rev-parse", "HEAD") or "unknown").strip()
    branch = (_git(root, "rev-parse", "--abbrev-ref", "HEAD") or "unknown").strip()
    source = ["--", ".", *(f":(exclude,top){path}" for path in dvc_written(root))]
    status = _git(root, "status", "--porcelain", "--untracked-files=no", *source)
    diff = _git_bytes(root, "diff", "HEAD", "--binary", *source) or b""
    others = _git(root, "ls-files", "--others", "--exclude-standard", "-z", *source) or ""
    listed = [p for p in others.split("\0") if p]
    untracked = [p for p in listed if not is_secret_file(p)]  # a .env, a key, a token file: never read
    dirty = "unknown" if status is None else str(bool(status.strip())).lower()
    tags = {
        "git.commit": commit,
        "git.branch": branch,
        "git.dirty": dirty,
        "git.untracked": str(len(listed)),
        "git.untracked_secret_files_skipped": str(len(listed) - len(untracked)),
        "mlflow.source.git.commit": commit,
    }
    texts: dict[str, str | bytes] = {"provenance/dirty.diff": diff}
    if untracked_contents:
        texts["provenance/untracked.diff"] = _untracked_diff(root, untracked)
    elif listed:
        tags["git.untracked_not_stored"] = str(len(listed))
        texts["provenance/untracked.txt"] = "".join(f"{p}\n" for p in sorted(listed))
    return tags, {k: v for k, v in texts.items() if v}


def _untracked_diff(root: Path, paths: list[str]) -> bytes:
    """A `git apply`-able patch that creates each untracked file up to UNTRACKED_MAX_BYTES."""
    parts = []
    for rel in sorted(paths)[:UNTRACKED_MAX_FILES]:
        if (root / rel).is_file() and (root / rel).stat().st_size <= UNTRACKED_MAX_BYTES:
            parts.append(_git_bytes(root, "diff", "--no-index", "--binary", "--", "/dev/null", rel, ok=(0, 1)) or b"")
    return b"".join(parts)


def file_hashes(folder: Path, known: dict[str, tuple[str, str]] | None = None) -> dict[str, tuple[str, str]]:
    """{relative path: (md5, sha256)} for every file under `folder`, read once each, except those
    whose hashes `known` gives (the prepared arrays: hashed by `prepare`, checked at start-up)."""
    known = known or {}
    hashes = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        hashes[rel] = known[rel] if rel in known else tuple(file_digests(path, "md5", "sha256"))
    return hashes


def dvc_dir_md5(hashes: dict[str, tuple[str, str]]) -> str:
    """DVC's md5 of a folder from `file_hashes`: md5 of the JSON list of {md5, relpath} sorted by
    relpath, plus '.dir'; the value DVC 3 writes to dvc.lock (no .dvcignore patterns applied)."""
    entries = [{"md5": md5, "relpath": rel} for rel, (md5, _) in sorted(hashes.items())]
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"


def data_info(
    root: Path, data_dir: str | Path, known: dict[str, tuple[str, str]] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """Tags and the `data-files.json` artifact that pin the data folder a run read (`known`: see
    `file_hashes`)."""
    folder = Path(data_dir).resolve()
    rel = os.path.relpath(folder, root) if folder.is_relative_to(root) else str(folder)
    hashes = file_hashes(folder, known)
    shas = {name: sha for name, (_, sha) in hashes.items()}
    tags = {
        "data.path": Path(rel).as_posix(),
        "data.md5": dvc_dir_md5(hashes),
        **{f"data.sha256.{name}": sha for name, sha in shas.items()},
    }
    locked = dvc_lock_outs(root).get(tags["data.path"])
    if locked:
        tags["data.dvc_lock_md5"] = locked
    return tags, {"provenance/data-files.json": json.dumps(shas, indent=2, sort_keys=True)}


def dvc_lock_outs(root: Path) -> dict[str, str]:
    """{path: md5} of every stage output recorded in dvc.lock (DVC writes a stage's entry when it
    finishes, so during `dvc repro train` the entry of `prepare` is the current one)."""
    lock = root / "dvc.lock"
    if not lock.is_file():
        return {}
    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
    return {out["path"]: out["md5"] for body in stages.values() for out in body.get("outs") or [] if "md5" in out}


def params_digest(sections: dict[str, Any]) -> str:
    """sha256 of the typed param sections a stage consumed, as canonical JSON.

    Equal for equal values however params.yaml spells them (1 or 1.0, key order), so it matches
    the values dvc.lock records for the stage once those are built into the same dataclasses.
    """
    return json_digest(sections)


def environment() -> dict[str, str]:
    """Versions (Python, torch, CUDA, cuDNN, NCCL; "none" without CUDA), host, platform, CPU."""
    import torch

    cuda_ok = torch.cuda.is_available()
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or NONE,
        "cudnn": str(torch.backends.cudnn.version()) if cuda_ok and torch.backends.cudnn.is_available() else NONE,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda_ok else NONE,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_cores": str(os.cpu_count()),
    }
    if cuda_ok:  # this node's GPUs (the speedup study keys its cache on them); `nodes_tags` has all
        info["gpus"] = node_info()["gpus"]
    return {f"env.{k}": v for k, v in info.items()}


def node_info() -> dict[str, str]:
    """This node's host name and GPUs (name and memory), to gather from every rank."""
    import torch

    gpus = NONE
    if torch.cuda.is_available():
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        gpus = ", ".join(f"{p.name} {p.total_memory // 2**20} MiB" for p in props)
    return {"host": socket.gethostname(), "gpus": gpus}


def nodes_tags(nodes: list[dict[str, str]]) -> dict[str, str]:
    """Tags for the job's nodes from every rank's `node_info()` (one entry per host)."""
    by_host = {n["host"]: n["gpus"] for n in nodes}
    return {
        "env.host": nodes[0]["host"],
        "env.hosts": ",".join(by_host),
        "env.num_nodes": str(len(by_host)),
        "env.gpus": "; ".join(f"{host}: {gpus}" for host, gpus in by_host.items()),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def launcher_info() -> dict[str, str]:
    """The launcher and its job ids, nodes, restart count, and the command lines."""
    env = dist.read_env()
    info = {f"launch.{k.lower()}": os.environ[k] for k in LAUNCH_VARS if k in os.environ}
    info["launch.kind"] = (
        "slurm" if "SLURM_JOB_ID" in os.environ else ("torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "process")
    )
    info["launch.restart_count"] = (
        os.environ.get("SLURM_RESTART_COUNT") or os.environ.get("TORCHELASTIC_RESTART_COUNT") or "0"
    )
    info["launch.world_size"] = str(env.world_size)
    info["launch.nnodes"] = str(max(1, env.world_size // max(1, env.local_world_size)))
    info["launch.command"] = shlex.join([sys.executable, *sys.argv])[:5000]
    info["launch.user_command"] = user_command()[:5000]
    return info


def user_command() -> str:
    """The outermost `scalelab ...` command among this process's ancestors (what the user or DVC
    ran), else this process's own command line."""
    try:
        import psutil

        found = None
        proc = psutil.Process().parent()
        while proc is not None and proc.pid > 1:
            cmd = proc.cmdline()
            if any(os.path.basename(arg) == "scalelab" for arg in cmd[:2]):
                found = cmd
            elif cmd[1:3] == ["-m", "scalelab.cli"]:  # a `scalelab` that re-exec'd into its workspace
                found = ["scalelab", *cmd[3:]]
            proc = proc.parent()
    except Exception:  # psutil missing, or a process vanished: fall back to our own argv
        found = None
    return shlex.join(found) if found else shlex.join(sys.argv)


def params_changes(root: Path, sections: dict[str, Any], names: tuple[str, ...] = ("train", "data")) -> dict[str, Any]:
    """{dotted key: value} of the `names` sections of `sections` (typed params as plain dicts) that
    differ from params.yaml as committed at HEAD; {} outside git or when HEAD's file does not load."""
    from scalelab.config import ConfigError, flatten, parse_params, to_dict

    text = _git(root, "show", "HEAD:params.yaml")
    try:
        committed = to_dict(parse_params(yaml.safe_load(text or ""), "HEAD:params.yaml"))
    except (ConfigError, yaml.YAMLError, TypeError, AttributeError):
        return {}
    now = flatten({k: sections[k] for k in names if k in sections})
    before = flatten({k: committed[k] for k in names if k in committed})
    return {k: v for k, v in now.items() if before.get(k) != v}


def dvc_info() -> dict[str, str]:
    """The DVC stage and experiment that ran this job, from the variables DVC sets for a stage:
    `dvc.exp_name` and `dvc.exp_baseline_rev` tell experiments apart in the UI."""
    names = {"DVC_STAGE": "dvc.stage", "DVC_EXP_NAME": "dvc.exp_name", "DVC_EXP_BASELINE_REV": "dvc.exp_baseline_rev"}
    return {tag: os.environ[var] for var, tag in names.items() if os.environ.get(var)}


def pip_freeze() -> str:
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    return "\n".join(dists) + "\n"


def collect(
    root: Path,
    *,
    data_dir: str | Path,
    nodes: list[dict[str, str]],
    params_sections: dict[str, Any],
    data_hashes: dict[str, tuple[str, str]] | None = None,
    untracked_contents: bool = False,
) -> tuple[dict[str, str], dict[str, str | bytes]]:
    """Returns (tags, artifacts): flat string tags and {artifact name: text (a diff: its bytes)}.

    Args:
        root: the repository root (git and dvc.lock).
        data_dir: the prepared-data folder the run reads.
        nodes: `node_info()` of every rank (all_gather_object).
        params_sections: the typed param sections the stage consumed, as plain dicts.
        data_hashes: {file: (md5, sha256)} already known for files of `data_dir` (not read again).
        untracked_contents: store untracked files' contents (tracking.upload_untracked).
    """
    git_tags, texts = git_info(root, untracked_contents)
    data_tags, data_texts = data_info(root, data_dir, data_hashes)
    tags = {
        **git_tags,
        **data_tags,
        "params.sha256": params_digest(params_sections),
        **environment(),
        **nodes_tags(nodes),
        **launcher_info(),
    }
    artifacts = {**texts, **data_texts, "provenance/pip-freeze.txt": pip_freeze()}
    if (root / "dvc.lock").is_file():
        artifacts["provenance/dvc.lock"] = (root / "dvc.lock").read_text()
    return scrub(tags, artifacts)


def scrub(tags: dict[str, str], artifacts: dict[str, str | bytes]) -> tuple[dict[str, str], dict[str, str | bytes]]:
    """Redacts secrets in every tag and every text that is only read; keeps each diff byte for byte
    with its sha256, or leaves it out when it adds a secret or exceeds DIFF_MAX_BYTES, and then
    tags the run not reproducible with the reason (the secret's file, line and kind, never its value)."""
    count, out_tags, out_texts, reasons = 0, {}, {}, []
    for key, value in tags.items():
        out_tags[key], n = redact(str(value))
        count += n
    for name, text in artifacts.items():
        if not isinstance(text, bytes):
            out_texts[name], n = redact(text)
            count += n
            continue
        tag = f"provenance.{Path(name).name}"
        if len(text) > DIFF_MAX_BYTES:  # not stored anyway: not scanned either (the job's start waits)
            out_tags[f"{tag}.omitted_bytes"] = str(len(text))
            reasons.append(f"{name} is {len(text)} bytes, over {DIFF_MAX_BYTES}: it is not stored")
        elif found := diff_findings(text.decode("utf-8", "surrogateescape")):
            more = f" and {len(found) - 1} more" if len(found) > 1 else ""
            out_tags[f"{tag}.withheld"] = f"a secret at {found[0]}{more}"
            reasons.append(f"the uncommitted changes hold a secret at {found[0]}{more}: {name} is not stored")
        else:
            out_texts[name] = text
            out_tags[f"{tag}.sha256"] = hashlib.sha256(text).hexdigest()
    if int(tags.get("git.untracked_not_stored", 0)):
        reasons.append(
            f"{tags['git.untracked_not_stored']} untracked file(s) are not stored (provenance/untracked.txt "
            "names them): commit them, or set tracking.upload_untracked: true"
        )
    out_tags["provenance.redactions"] = str(count)
    out_tags["provenance.diff_max_bytes"] = str(DIFF_MAX_BYTES)
    out_tags["scalelab.reproducible"] = str(not reasons).lower()
    if reasons:
        out_tags["scalelab.not_reproducible"] = "; ".join(reasons)
    return out_tags, out_texts
