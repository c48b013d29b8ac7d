"""Atomic, resumable checkpoints.

A checkpoint is one file `step-XXXXXXXX.pt` holding model, optimizer, scaler, step, epoch, sampler
position and the RNG state of every rank. It is written to a temp file in the same folder and moved
into place with os.replace, so a file with that name is always complete; the newest `keep` are
kept. Each carries a fingerprint of the config that produced it: a checkpoint made under other
params is never resumed from. `job.json` ties the folder to one fingerprint and one tracking run id,
written before the first step, so a job killed before its first checkpoint still resumes into the
same MLflow run.
"""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from scalelab.io import atomic_write_bytes, atomic_write_json

log = logging.getLogger(__name__)
PATTERN = re.compile(r"^step-(\d{8})\.pt$")


class Checkpointer:
    def __init__(self, folder: str | Path, fingerprint: str, keep: int = 2) -> None:
        self.folder = Path(folder)
        self.fingerprint = fingerprint
        self.keep = keep

    def steps(self) -> list[int]:
        """Steps of the checkpoint files present, newest first."""
        if not self.folder.is_dir():
            return []
        found = (PATTERN.match(p.name) for p in self.folder.iterdir())
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def path(self, step: int) -> Path:
        return self.folder / f"step-{step:08d}.pt"

    def claim(self) -> str | None:
        """Binds the folder to this fingerprint; returns the run id of an earlier try, if any.

        A folder made under another fingerprint is cleared first: its checkpoints belong to
        other params. Call on global rank 0 only, before the first step.
        """
        meta = self.folder / "job.json"
        if meta.is_file():
            old = json.loads(meta.read_text())
            if old.get("fingerprint") == self.fingerprint:
                return old.get("run_id")
            log.warning("checkpoints in %s were made with other params; starting afresh", self.folder)
            shutil.rmtree(self.folder)
        return None

    def record(self, run_id: str | None) -> None:
        atomic_write_json(self.folder / "job.json", {"fingerprint": self.fingerprint, "run_id": run_id})

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Writes one checkpoint atomically and prunes all but the newest `keep`."""
        buf = io.BytesIO()
        torch.save({**state, "step": step, "fingerprint": self.fingerprint}, buf)
        path = self.path(step)
        atomic_write_bytes(path, buf.getvalue())
        for old in self.steps()[self.keep:]:
            self.path(old).unlink(missing_ok=True)
        return path

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint that loads and matches the fingerprint, or None."""
        for step in self.steps():
            try:
                state = torch.load(self.path(step), map_location="cpu", weights_only=False)
            except Exception as exc:  # a damaged file: fall back to an older one
                log.warning("skipping unreadable checkpoint %s: %s", self.path(step), exc)
                continue
            if state.get("fingerprint") == self.fingerprint:
                return state
        return None
