"""Where things are: the repository, the tracking store's home, and the code folders each DVC
stage depends on.

Two roots, never the current directory by accident:
- `repo_root()`: the workspace a command runs in, found from its params file (`use_repo_of`),
  exported as SCALELAB_REPO so that every process the command starts agrees. Provenance (git),
  relative data paths and cluster profiles are read there.
- `store_root()`: where `mlflow.db`, `mlartifacts/` and the study's cell cache live: the main
  repository. DVC runs queued and `--temp` experiments in a copy under `.dvc/tmp/exps/` that it
  deletes afterwards, and sets DVC_ROOT to the main repository for every stage it runs; outside
  DVC it is the workspace itself.

What each result depends on is declared once, in dvc.yaml: a stage's `deps` list the code folders
it runs. `stage_code(stage)` reads them back, so the training checkpoint fingerprint and the
study's cell key hash exactly the code that makes DVC rerun the stage (`code_digest`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import yaml

# the checkout this package runs from (an editable install, or a `scalelab reproduce` worktree)
PACKAGE_ROOT = Path(__file__).resolve().parents[3]
CODE_ROOTS = ("libs/", "experiments")


REPO_ENV = "SCALELAB_REPO"  # the workspace, set by the command that read the params file
DVC_ROOT_ENV = "DVC_ROOT"  # set by DVC for each stage: the main repository, also in a temp workspace


def find_repo(start: str | Path) -> Path | None:
    """The nearest folder at or above `start` that holds dvc.yaml, or None."""
    here = Path(start).resolve()
    return next((p for p in (here, *here.parents) if (p / "dvc.yaml").is_file()), None)


def repo_root(start: str | Path | None = None) -> Path:
    """The workspace: `start`'s repository when given, else SCALELAB_REPO, else cwd's repository
    (else cwd)."""
    if start is None and os.environ.get(REPO_ENV):
        return Path(os.environ[REPO_ENV])
    here = Path(start or os.getcwd()).resolve()
    return find_repo(here) or here


def store_root() -> Path:
    """The main repository, home of the tracking store: DVC_ROOT under DVC, else `repo_root()`."""
    dvc_root = os.environ.get(DVC_ROOT_ENV)
    return Path(dvc_root).resolve() if dvc_root and Path(dvc_root).is_dir() else repo_root()


def stage_code(stage: str, root: Path = PACKAGE_ROOT) -> list[str]:
    """The code folders (under libs/ or experiments/) that `stage` lists in root/dvc.yaml."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    if stage not in stages:
        raise KeyError(f"{root / 'dvc.yaml'} has no stage {stage!r}")
    return [d for d in stages[stage].get("deps", []) if isinstance(d, str) and d.startswith(CODE_ROOTS)]


def code_digest(folders: list[str], root: Path = PACKAGE_ROOT) -> str:
    """sha256 over every .py file under `folders` (relative path and content), in path order."""
    digest = hashlib.sha256()
    for path in sorted({p for folder in folders for p in (root / folder).rglob("*.py")}):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def stage_code_digest(stage: str, root: Path = PACKAGE_ROOT) -> str:
    """`code_digest` of the folders `stage` depends on."""
    return code_digest(stage_code(stage, root), root)
