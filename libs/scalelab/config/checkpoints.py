"""Where checkpoints live (`train.checkpoint_dir`) and what a job resumes from (`train.resume_from`):
the rules on the form of these values, and on what `resume_from` names on disk."""

from __future__ import annotations

import re
from pathlib import Path

CHECKPOINT_NAME = re.compile(r"^step-(\d{8})\.(pt|dcp)$")  # one checkpoint (training.checkpoint)
GLOB_CHARACTERS = "*?["


def checkpoint_dir_problem(value: str) -> str | None:
    """What is wrong with the form of `train.checkpoint_dir = value`, or None."""
    if value in ("", "store"):
        return None
    if any(c in value for c in GLOB_CHARACTERS + "\n") or value != value.strip():
        return "it holds a glob character, a line break or surrounding spaces"
    protocol, sep, rest = value.partition("://")
    if sep:
        import fsspec

        if protocol not in fsspec.available_protocols():
            return f"{protocol}:// is no filesystem fsspec knows"
        if not rest.strip("/"):
            return "the URL names no bucket or folder"
    if CHECKPOINT_NAME.match(Path(rest if sep else value).name):
        return "it names one checkpoint, not the folder that holds them"
    return None


def resume_from_problem(value: str, root: Path) -> str | None:
    """What is wrong, on disk, with `train.resume_from = value` read from the workspace `root`: the
    folder does not exist or holds no checkpoint; None when it is off or fine. Not part of
    `parse_params` (a stage that only reads params must not fail once the folder is gone): the
    validate stage and the train command's plan ask it, before anything starts."""
    if not value:
        return None
    path = Path(value).expanduser()
    path = path if path.is_absolute() else root / path
    if not path.is_dir():
        return f"{path} " + ("does not exist" if not path.exists() else "is not a folder")
    if not any(CHECKPOINT_NAME.match(p.name) for p in path.iterdir()):
        return f"{path} holds no checkpoint (step-XXXXXXXX.pt or step-XXXXXXXX.dcp)"
    return None


def resume_from_error(value: str, problem: str, stale_sets: list[str]) -> str:
    """The one-line refusal of `train.resume_from = value`, with the sets that could be given."""
    allowed = ", ".join(stale_sets) if stale_sets else "results/train/checkpoints/stale-<fingerprint>"
    return (
        f"train.resume_from = {value!r} is not allowed: {problem}; give '' (off) or a folder of "
        f"checkpoints moved aside: {allowed}"
    )
