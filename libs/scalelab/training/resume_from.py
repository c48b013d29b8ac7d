"""`train.resume_from`: a job with no checkpoint of its own starts from a folder of checkpoints made
with other params, data or code, on purpose (the sets `Checkpointer.claim` moves aside into
`<out>/checkpoints/stale-<fingerprint>/`). A relative path is read from the workspace
(runtime.paths.repo_root). The job's run records it: `scalelab.resumed_from` and
`scalelab.resumed_from_fingerprint` tags (training.trainer). Once the job has checkpoints of its own, a
rerun resumes from those, as any job does.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from scalelab.config import ConfigError
from scalelab.config.schema import resume_from_error, resume_from_problem
from scalelab.runtime import dist
from scalelab.runtime.paths import repo_root
from scalelab.tracking import Tracker
from scalelab.training.best import Best
from scalelab.training.checkpoint import Checkpointer, CheckpointError, cause, read_checkpoint
from scalelab.training.checkpoint_parts import PENDING_KEY, CheckpointParts
from scalelab.training.plan import BEST_FILE

log = logging.getLogger(__name__)


def resume_source(value: str) -> Path | None:
    """The folder `train.resume_from` names (relative to the workspace), or None when it is off."""
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else repo_root() / path


def load_resume_source(source: Path, ckpt: Checkpointer, env: dist.DistEnv) -> dict[str, Any]:
    """The newest checkpoint in `source` (train.resume_from), whatever its fingerprint, for a job
    that has none of its own yet; its best.pt comes along (rank 0), so best value and file agree."""
    state = load_newest(source)
    if state is None:
        raise CheckpointError(f"train.resume_from = {str(source)!r}: no undamaged checkpoint is left there")
    if env.is_main:
        log.warning(
            "resuming from step %d of %s (fingerprint %s; this job's is %s): train.resume_from takes a "
            "checkpoint made with other params, data or code",
            state["step"],
            source,
            state.get("fingerprint"),
            ckpt.fingerprint,
        )
        if (source / BEST_FILE).is_file():
            ckpt.files.write(BEST_FILE, (source / BEST_FILE).read_bytes())
    dist.barrier()  # every rank sees best.pt as rank 0 left it
    return state


def restore_resumed(
    state: dict[str, Any], source: Path, ckpt: Checkpointer, parts: CheckpointParts, best: Best, tracker: Tracker
) -> int:
    """Restores the parts from the checkpoint `load_resume_source` read, all but the pending
    metrics (they stay in its own run); the run records where it came from. Returns the step it
    goes on from.

    Raises:
        CheckpointError: the checkpoint does not fit this job (another model, optimizer or parts).
    """
    try:
        parts.load(state, skip=(PENDING_KEY,))
    except Exception as exc:
        raise CheckpointError(
            f"train.resume_from = {str(source)!r}: its checkpoint of step {state['step']} does not fit this job's "
            f"model, optimizer or parts: {cause(exc)}"
        ) from exc
    if not ckpt.files.is_file(BEST_FILE):  # no best.pt came with it: no best yet
        best.load_state_dict({"value": None, "step": 0, "since_better": 0})
    tracker.set_tags(
        {"scalelab.resumed_from": str(source), "scalelab.resumed_from_fingerprint": state.get("fingerprint")}
    )
    return state["step"]


def load_newest(folder: str | Path) -> dict[str, Any] | None:
    """The newest undamaged checkpoint in `folder`, whatever its fingerprint (`train.resume_from`:
    a set moved aside, resumed on purpose with other params or code), or None."""
    source = Checkpointer(folder, "")
    for step in source.steps():
        state = read_checkpoint(source.path(step))
        if state is not None:
            return state
    return None


def check_resume_from(value: str, out_dir: str | Path | None) -> None:
    """`train.resume_from` names a folder that holds a checkpoint, other than the job's own.

    Raises:
        ConfigError: naming the key, the value, what is wrong and the sets that could be given.
    """
    source = resume_source(value)
    if source is None:
        return
    own = Path(out_dir) / "checkpoints" if out_dir is not None else None
    sets = [str(own / p.name) for p in Checkpointer(own, "").stale_sets()] if own is not None else []
    if own is not None and source.resolve() == own.resolve():
        problem = f"{source} is this job's own checkpoint folder, which resumes by itself while the fingerprint matches"
    else:
        problem = resume_from_problem(value, repo_root())
    if problem is not None:
        raise ConfigError(resume_from_error(value, problem, sets))
