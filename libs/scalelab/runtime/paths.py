"""Where things are: the repository root, and the code folders each DVC stage depends on.

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


def repo_root(start: str | Path | None = None) -> Path:
    """The nearest folder above `start` (default: cwd) that holds dvc.yaml; else cwd."""
    here = Path(start or os.getcwd()).resolve()
    return next((p for p in (here, *here.parents) if (p / "dvc.yaml").is_file()), here)


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
