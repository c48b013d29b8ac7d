"""Atomic, resumable checkpoints.

A checkpoint is one file `step-XXXXXXXX.pt` holding model, optimizer, scaler, step, epoch, sampler
position and the RNG state of every rank. It is written to a temp file in the same folder and moved
into place with os.replace, so a file with that name is always complete; the newest `keep` are
kept. Each carries a fingerprint of what decides the final weights: the train params, the data,
the world size and the code of every folder the DVC stage `train` depends on (dvc.yaml). A
checkpoint made under other params, data or code is never resumed from. `job.json` ties the
folder to one fingerprint and one tracking run id, written before the first step, so a job killed
before its first checkpoint still resumes into the same MLflow run. Once the job has written its
outputs, `job.json` says `finished`: only an interrupted job resumes; a rerun of a finished one
(another cadence, `dvc repro -f`, a new experiment) trains anew into a new run.
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

from scalelab.config import TrainConfig, to_dict
from scalelab.runtime import dist, seeds
from scalelab.runtime.io import atomic_write_bytes, atomic_write_json, json_digest
from scalelab.runtime.paths import stage_code_digest
from scalelab.training import strategy
from scalelab.training.loop import Loop

log = logging.getLogger(__name__)
PATTERN = re.compile(r"^step-(\d{8})\.pt$")
# knobs that change neither the math nor the data order: a resume may differ in these
CADENCE_KEYS = (
    "log_every_steps",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "profile",
    "launcher",
    "collective_timeout_s",
)


def fingerprint(train: TrainConfig, manifest: dict[str, Any], world_size: int) -> str:
    """A hash of everything that decides the final weights, code included."""
    cfg = {k: v for k, v in to_dict(train).items() if k not in CADENCE_KEYS}
    return json_digest(
        {"train": cfg, "data": manifest["splits"], "world_size": world_size, "code": stage_code_digest("train")},
        length=16,
    )


def checkpoint_state(loop: Loop, epoch: int, run_id: str | None) -> dict[str, Any]:
    """Gathers every rank's RNG state (and, under fsdp, the sharded model and optimizer state);
    the returned dict is complete on rank 0 only. Every rank must call it."""
    rngs = dist.all_gather_object(seeds.rng_state())
    model, optimizer = strategy.full_state(loop.model, loop.optimizer)
    return {
        "model": model,
        "optimizer": optimizer,
        "scaler": loop.scaler.state_dict(),
        "epoch": epoch,
        "rng": rngs,
        "run_id": run_id,
    }


def restore(state: dict[str, Any] | None, loop: Loop, seed: int, env: dist.DistEnv) -> int:
    """Restores a checkpoint if given, else seeds this rank; returns the global step.

    The epoch and the sampler position follow from the step: step // steps_per_epoch, and the
    remainder in optimizer steps.
    """
    if state is None:
        seeds.seed_all(seeds.rank_seed(seed, env.rank))
        return 0
    strategy.load_full_state(loop.model, loop.optimizer, state["model"], state["optimizer"])
    loop.scaler.load_state_dict(state["scaler"])
    seeds.set_rng_state(state["rng"][env.rank])
    return state["step"]


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
            if old.get("fingerprint") == self.fingerprint and not old.get("finished"):
                return old.get("run_id")
            # this job holds the output folder's lock (runtime.lock), so it owns what is in it
            if old.get("fingerprint") == self.fingerprint:
                log.info("run %s in %s finished: training anew into a new run", old.get("run_id"), self.folder)
            else:
                log.warning(
                    "removing %d checkpoint(s) of fingerprint %s from %s: they were made with other params, "
                    "data or code (this job's fingerprint is %s)",
                    len(self.steps()),
                    old.get("fingerprint"),
                    self.folder,
                    self.fingerprint,
                )
            shutil.rmtree(self.folder)
        return None

    def record(self, run_id: str | None, finished: bool = False) -> None:
        """Ties the folder to this fingerprint and run; `finished` once the job wrote its outputs."""
        atomic_write_json(
            self.folder / "job.json", {"fingerprint": self.fingerprint, "run_id": run_id, "finished": finished}
        )

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Writes one checkpoint atomically and prunes all but the newest `keep`."""
        buf = io.BytesIO()
        torch.save({**state, "step": step, "fingerprint": self.fingerprint}, buf)
        path = self.path(step)
        atomic_write_bytes(path, buf.getvalue())
        for old in self.steps()[self.keep :]:
            self.path(old).unlink(missing_ok=True)
        return path

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint that loads and matches the fingerprint, or None."""
        for step in self.steps():
            try:
                state = torch.load(self.path(step), map_location="cpu", weights_only=True)
            except Exception as exc:  # a damaged file: fall back to an older one
                log.warning("skipping unreadable checkpoint %s: %s", self.path(step), exc)
                continue
            if state.get("fingerprint") == self.fingerprint:
                return state
        return None
