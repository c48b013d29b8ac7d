"""Atomic, resumable checkpoints.

A checkpoint holds the state of every stateful part of the job, each under its name: model and
optimizer, scaler, LR schedule, step and sampler position, meter window, pending metrics, best
value and patience, the RNG state of every rank (training.checkpoint_parts: one registration per
part); this module is where they are stored. Under ddp and single it is one file `step-XXXXXXXX.pt`, written to a temp
file in the same folder and moved into place with os.replace. Under fsdp it is a folder
`step-XXXXXXXX.dcp`: every rank writes its own shards of model and optimizer with
`torch.distributed.checkpoint` (no rank ever holds the whole state), rank 0 adds the rest as
`extra.pt`, and renames the hidden folder into place. Either way a name that matches is complete
(the rename is the commit marker); the newest `keep` are kept. In an object store
(`train.checkpoint_dir`, training.checkpoint_files) there is no rename: a `.pt` file is one PUT, and
a sharded checkpoint is written in place, committed by its `extra.pt`, written last: a
`step-XXXXXXXX.dcp` without it is never loaded and is removed by a later save.

Each carries a fingerprint of what decides the final weights: the train params, the data, the
global batch and the code of every folder the DVC stage `train` depends on (dvc.yaml). A
checkpoint made under other params, data or code is never resumed from, and never deleted: the
next job moves it aside into `stale-<fingerprint>/` (`Checkpointer.claim`), where
`train.resume_from` may take it up on purpose (training.resume_from). One made at another world
size with the same global batch is resumed (DCP reshards on load). Loading skips only known
damage; a checkpoint that is intact but cannot be loaded stops the job (`CheckpointError`).
`job.json` ties the folder to one fingerprint and one tracking run id, written before the first
step, so a job killed before its first checkpoint still resumes into the same MLflow run. Once the job has written its
outputs, `job.json` says `finished`: only an interrupted job resumes; a rerun of a finished one
(another cadence, `dvc repro -f`, a new experiment) trains anew into a new run.

With `asynchronous` (train.async_checkpoint), `save` returns once the state is copied: the write
and the commit run in a background thread (fsdp: DCP's `async_save`, on a gloo group of its
own), overlapping the next steps. `wait()` blocks until the last save is committed; the next
save and the end of training call it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from scalelab.config import TrainConfig, to_dict
from scalelab.config.schema import CHECKPOINT_NAME
from scalelab.runtime import dist
from scalelab.runtime.io import json_digest
from scalelab.runtime.paths import stage_code_digest
from scalelab.storage import Store
from scalelab.training.checkpoint_files import (  # noqa: F401 (read_checkpoint: re-exported)
    EXTRA_FILE,
    JOB_FILE,
    METADATA_DIGEST,
    SIZES_FILE,
    STORE_KEY,
    CheckpointError,
    LocalFiles,
    RemoteFiles,
    cause,
    files_at,
    metadata_refusal,
    read_checkpoint,
    read_entry,
    zip_damage,
)
from scalelab.training.checkpoint_parts import checkpoint_state, read_shards, restore  # noqa: F401 (re-exported)
from scalelab.training.plan import BEST_FILE  # beside the checkpoints: the best weights so far

log = logging.getLogger(__name__)
PATTERN = CHECKPOINT_NAME  # step-XXXXXXXX.pt (a file) or step-XXXXXXXX.dcp (a sharded folder)
# checkpoints of another fingerprint, moved aside by `Checkpointer.claim` (and a move under way)
STALE_PATTERN = re.compile(r"^stale-([0-9a-zA-Z]+)(-\d+)?$")
MOVING_PATTERN = re.compile(r"^\.stale-([0-9a-zA-Z]+)\.moving$")
KEEP_STALE = 2  # stale sets kept (the newest); older ones are removed, never the one resumed from
# knobs that change neither the math nor the data order: a resume may differ in these
CADENCE_KEYS = (
    "log_every_steps",
    "sample_tokens",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "profile",
    "launcher",
    "collective_timeout_s",
    "async_checkpoint",
    "checkpoint_dir",  # where checkpoints live does not change the math
)
# how the global batch is split over ranks and micro-steps: the ranks' batches of a step together are
# one process's batch (training.sampler), so these change float rounding and each rank's random
# streams, not the math; a checkpoint resumes under another split of the same global batch
SHAPE_KEYS = ("nproc_per_node", "num_nodes", "batch_size", "grad_accum_steps")


def fingerprint(train: TrainConfig, manifest: dict[str, Any]) -> str:
    """A hash of everything that decides the final weights, code included."""
    cfg = {k: v for k, v in to_dict(train).items() if k not in CADENCE_KEYS + SHAPE_KEYS}
    return json_digest(
        {
            "train": cfg,
            "data": manifest["splits"],
            "global_batch": train.global_batch,
            "code": stage_code_digest("train"),
        },
        length=16,
    )


class Checkpointer:
    def __init__(
        self,
        folder: str | Path,
        fingerprint: str,
        keep: int = 2,
        asynchronous: bool = False,
        store: Store | None = None,
    ) -> None:
        """`folder`: a path, or a URL in an object store, reached with `store`'s endpoint and
        credentials (default: this clone's store; training.checkpoint_files)."""
        self.files: LocalFiles | RemoteFiles = files_at(folder, store)
        self.folder = self.files.at()  # a Path, or the URL
        self.fingerprint = fingerprint
        self.keep = keep
        self.asynchronous = asynchronous
        self._pending: Future | None = None  # the last asynchronous save, until committed
        self._writer: ThreadPoolExecutor | None = None
        self._group = None  # the process group of DCP's asynchronous saves

    def wait(self) -> None:
        """Blocks until the last asynchronous save is written and committed (re-raising its error)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _in_background(self, work) -> None:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending = self._writer.submit(work)

    def steps(self) -> list[int]:
        """Steps of the checkpoint files present, newest first."""
        names = self.files.names()
        if self.files.remote:  # in a store, a sharded checkpoint without its extra.pt never committed
            names = [n for n in names if not n.endswith(".dcp") or self.files.is_file(f"{n}/{EXTRA_FILE}")]
        found = (PATTERN.match(name) for name in names)
        return sorted({int(m.group(1)) for m in found if m}, reverse=True)

    def name(self, step: int) -> str:
        """The checkpoint of `step`: a sharded folder if there is one, else the file."""
        sharded = f"step-{step:08d}.dcp"
        return sharded if self.files.is_dir(sharded) else f"step-{step:08d}.pt"

    def path(self, step: int) -> Path | str:
        return self.files.at(self.name(step))

    def meta(self) -> dict[str, Any] | None:
        """job.json: the fingerprint and run id the folder is tied to, or None."""
        return json.loads(self.files.read(JOB_FILE)) if self.files.is_file(JOB_FILE) else None

    def claim(self, keep: Path | None = None) -> str | None:
        """Binds the folder to this fingerprint; returns the run id of an earlier try, if any.

        The checkpoints of another fingerprint (other params, data or code) are never resumed
        from and never deleted: they are moved aside into `stale-<their fingerprint>/` inside the
        folder, named in one log line, where `train.resume_from` can take them up. Of the stale
        sets, the newest `KEEP_STALE` are kept, and `keep` (the one this job resumes from) too.
        A finished job's checkpoints of this very fingerprint are removed: a rerun remakes them.
        Call on global rank 0 only, before the first step.
        """
        old = self.meta()
        if old is None:
            for done in self.files.finish_moves(MOVING_PATTERN):  # a move aside killed after it took job.json
                log.warning("finished moving %s aside", done)
            return None
        if old.get("fingerprint") == self.fingerprint and not old.get("finished"):
            return old.get("run_id")
        # this job holds the output folder's lock (runtime.lock), so it owns what is in it
        if old.get("fingerprint") == self.fingerprint:
            log.info("run %s in %s finished: training anew into a new run", old.get("run_id"), self.folder)
            for entry in self._own_entries():
                self.files.remove(entry)
            return None
        found = self.steps()
        moving = self.files.moving(str(old.get("fingerprint")))  # a move aside killed halfway
        if not found and not self.files.exists(BEST_FILE) and not moving:  # none saved yet
            for entry in self._own_entries():
                self.files.remove(entry)
            return None
        stale = self.files.move_aside(self._own_entries(), str(old.get("fingerprint")))
        log.warning(
            "moved %d checkpoint(s) of fingerprint %s (newest: step %d) to %s: they were made with other "
            "params, data or code (this job's fingerprint is %s) and are not resumed; to go on from them "
            "anyway, set train.resume_from: %s",
            len(found),
            old.get("fingerprint"),
            found[0] if found else 0,
            stale,
            self.fingerprint,
            stale,
        )
        self._prune_stale(keep)
        return None

    def stale_sets(self) -> list[Path | str]:
        """The checkpoint sets moved aside (`stale-<fingerprint>[-n]/`), newest first."""
        found = [n for n in self.files.names() if STALE_PATTERN.match(n) and self.files.is_dir(n)]
        found.sort(key=lambda n: (self.files.age(n), n), reverse=True)
        return [self.files.at(n) for n in found]

    def _own_entries(self) -> list[str]:
        """What the folder holds for its one fingerprint: everything but the stale sets."""
        moving = MOVING_PATTERN.match
        return [n for n in self.files.names() if not STALE_PATTERN.match(n) and not moving(n)]

    def _prune_stale(self, keep: Path | None) -> None:
        """Removes the stale sets older than the newest `KEEP_STALE`, never `keep`."""
        resolve = (lambda p: str(p).rstrip("/")) if self.files.remote else (lambda p: Path(p).resolve())
        protected = resolve(keep) if keep is not None else None
        for old in self.stale_sets()[KEEP_STALE:]:
            if resolve(old) != protected:
                log.info("removing %s: older than the newest %d checkpoint sets moved aside", old, KEEP_STALE)
                self.files.remove(str(old).rstrip("/").rsplit("/", 1)[-1])

    def record(self, run_id: str | None, finished: bool = False) -> None:
        """Ties the folder to this fingerprint and run; `finished` once the job wrote its outputs."""
        meta = {"fingerprint": self.fingerprint, "run_id": run_id, "finished": finished}
        self.files.write(JOB_FILE, (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())

    def save(self, step: int, state: dict[str, Any], shards: dict[str, Any] | None = None) -> Path:
        """Writes one checkpoint atomically and prunes all but the newest `keep`.

        Without `shards`, global rank 0 alone calls it. With them (fsdp), every rank does: each
        writes its shards into a hidden folder, then rank 0 writes `state` there and renames the
        folder into place.
        """
        self.wait()
        buf = io.BytesIO()
        torch.save({**state, "step": step, "fingerprint": self.fingerprint}, buf)  # a copy: training may go on
        if shards is not None:
            return self._save_shards(step, shards, buf.getvalue())
        path = self.files.at(f"step-{step:08d}.pt")

        def write() -> None:
            self.files.write(f"step-{step:08d}.pt", buf.getvalue())
            self._prune()

        self._in_background(write) if self.asynchronous else write()
        return path

    def _prune(self) -> None:
        for old in self.steps()[self.keep :]:
            self.files.remove(self.name(old))
        if self.files.remote:  # sharded checkpoints of a save that never committed (no extra.pt)
            for name in self.files.names():
                if name.endswith(".dcp") and PATTERN.match(name) and not self.files.is_file(f"{name}/{EXTRA_FILE}"):
                    self.files.remove(name)

    def _save_shards(self, step: int, shards: dict[str, Any], extra: bytes) -> Path:
        import torch.distributed as tdist
        import torch.distributed.checkpoint as dcp

        files, name = self.files, f"step-{step:08d}.dcp"
        # on a disk: into a hidden folder, renamed into place; in a store: in place, committed by extra.pt
        tmp = name if files.remote else f".{name}.tmp"
        main = dist.read_env().is_main
        if main:
            if files.exists(tmp):  # left by a save killed earlier at this step
                files.remove(tmp)
            if not files.remote:
                files.at(tmp).mkdir(parents=True)
        dist.barrier()

        def commit() -> None:  # rank 0, once every rank's shards and the metadata are written
            if main:
                files.write(f"{tmp}/{SIZES_FILE}", json.dumps(files.sizes(tmp)).encode())  # checked at load
                digest = hashlib.sha256(files.read(f"{tmp}/.metadata")).hexdigest()  # checked before unpickling
                files.write(f"{tmp}/{METADATA_DIGEST}", f"{digest}\n".encode())
                files.write(f"{tmp}/{EXTRA_FILE}", extra)  # in a store, the commit: written last
                if not files.remote:
                    if files.exists(name):  # a damaged one of this step, skipped at load: replaced
                        files.remove(name)
                    os.replace(files.at(tmp), files.at(name))  # the commit: a folder with this name is complete
                self._prune()

        if not self.asynchronous:
            with files.guard(f"writing {name}"):  # returns once every rank's shards and the metadata are written
                dcp.save(shards, **files.dcp(tmp, writing=True))
            commit()
            return files.at(name)
        if self._group is None and tdist.is_initialized():  # every rank saves: a collective call
            self._group = tdist.new_group(backend="gloo")  # the background writes' collectives, apart from training's
        written = dcp.async_save(shards, **files.dcp(tmp, writing=True), process_group=self._group)  # once staged

        def finish() -> None:
            with files.guard(f"writing {name}"):
                written.result()
            commit()

        self._in_background(finish)
        return files.at(name)

    def load_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint that loads and matches the fingerprint, or None.

        Only known damage is skipped, with a warning: a truncated or corrupt file (not a zip, or a
        member failing its CRC), a sharded folder without its `extra.pt`. Anything else (a type
        that `weights_only` refuses, a file that cannot be opened) stops the job with its cause,
        rather than falling back to an older checkpoint or to step 0.

        Raises:
            CheckpointError: a checkpoint that is intact but cannot be loaded.
        """
        for step in self.steps():
            state = read_entry(self.files, self.name(step))
            if state is not None and state.get("fingerprint") == self.fingerprint:
                return state
        return None
