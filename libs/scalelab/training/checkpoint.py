"""Atomic, resumable checkpoints.

A checkpoint holds model, optimizer, step, epoch, sampler position, the RNG state of every rank
and the `state_dict()` of every other stateful part of the job (scaler, LR scheduler, best value
and patience: `parts`). Under ddp and single it is one file `step-XXXXXXXX.pt`, written to a temp
file in the same folder and moved into place with os.replace. Under fsdp it is a folder
`step-XXXXXXXX.dcp`: every rank writes its own shards of model and optimizer with
`torch.distributed.checkpoint` (no rank ever holds the whole state), rank 0 adds the rest as
`extra.pt`, and renames the hidden folder into place. Either way a name that matches is complete
(the rename is the commit marker); the newest `keep` are kept.

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

import io
import json
import logging
import os
import re
import shutil
import zipfile
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from scalelab.config import TrainConfig, to_dict
from scalelab.config.schema import CHECKPOINT_NAME
from scalelab.runtime import dist, seeds
from scalelab.runtime.io import atomic_write_bytes, atomic_write_json, json_digest
from scalelab.runtime.paths import stage_code_digest
from scalelab.training import strategy
from scalelab.training.loop import Loop
from scalelab.training.plan import BEST_FILE  # beside the checkpoints: the best weights so far

log = logging.getLogger(__name__)
PATTERN = CHECKPOINT_NAME  # step-XXXXXXXX.pt (a file) or step-XXXXXXXX.dcp (a sharded folder)
EXTRA_FILE = "extra.pt"  # in a sharded checkpoint: everything but the shards (written by rank 0)
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


def checkpoint_state(
    loop: Loop, epoch: int, run_id: str | None, parts: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the state, complete on rank 0 only; the shards of this rank under fsdp, else None).

    Every rank must call it: it gathers every rank's RNG state. `parts` are the job's stateful
    parts beyond the loop's (e.g. the best-value tracker). Under ddp and single the state holds
    the model's and optimizer's state dicts; under fsdp each rank's shards come separately, for
    `Checkpointer.save` to write without gathering them.
    """
    state = {
        "parts": {name: part.state_dict() for name, part in {**loop.stateful(), **parts}.items()},
        "epoch": epoch,
        "rng": dist.all_gather_object(seeds.rng_state()),
        "run_id": run_id,
    }
    if strategy.is_sharded(loop.model):
        return state, strategy.sharded_state(loop.model, loop.optimizer)
    return {**state, "model": strategy.unwrap(loop.model).state_dict(), "optimizer": loop.optimizer.state_dict()}, None


def restore(state: dict[str, Any] | None, loop: Loop, seed: int, env: dist.DistEnv, parts: dict[str, Any]) -> int:
    """Restores a checkpoint if given, else seeds this rank; returns the global step.

    The epoch and the sampler position follow from the step: step // steps_per_epoch, and the
    remainder in optimizer steps. A checkpoint made at another world size (same global batch)
    resumes too: shards are resharded on load, and each rank's random streams start anew from
    (seed, step), since the ranks' streams do not map onto a new number of ranks.
    """
    if state is None:
        seeds.seed_all(seeds.rank_seed(seed, env.rank))
        return 0
    if "shards" in state:
        strategy.load_sharded_state(loop.model, loop.optimizer, lambda target: read_shards(state["shards"], target))
    else:
        strategy.unwrap(loop.model).load_state_dict(state["model"])
        loop.optimizer.load_state_dict(state["optimizer"])
    for name, part in {**loop.stateful(), **parts}.items():
        part.load_state_dict(state["parts"][name])
    if len(state["rng"]) == env.world_size:
        seeds.set_rng_state(state["rng"][env.rank])
    else:
        log.warning(
            "resuming step %d, saved by %d ranks, on %d: the same data order; each rank's random "
            "streams (dropout) start anew from the seed and the step",
            state["step"],
            len(state["rng"]),
            env.world_size,
        )
        seeds.seed_all(seeds.rank_seed(seed + state["step"], env.rank))
    return state["step"]


def read_shards(path: str | Path, target: dict[str, Any]) -> None:
    """Loads a sharded checkpoint's tensors into `target` in place (DCP: each rank reads what its
    shards need, resharding when the world size changed)."""
    import torch.distributed.checkpoint as dcp

    dcp.load(target, checkpoint_id=str(path))


class Checkpointer:
    def __init__(self, folder: str | Path, fingerprint: str, keep: int = 2, asynchronous: bool = False) -> None:
        self.folder = Path(folder)
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
        if not self.folder.is_dir():
            return []
        found = (PATTERN.match(p.name) for p in self.folder.iterdir())
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def path(self, step: int) -> Path:
        """The checkpoint of `step`: a sharded folder if there is one, else the file."""
        sharded = self.folder / f"step-{step:08d}.dcp"
        return sharded if sharded.is_dir() else self.folder / f"step-{step:08d}.pt"

    def claim(self, keep: Path | None = None) -> str | None:
        """Binds the folder to this fingerprint; returns the run id of an earlier try, if any.

        The checkpoints of another fingerprint (other params, data or code) are never resumed
        from and never deleted: they are moved aside into `stale-<their fingerprint>/` inside the
        folder, named in one log line, where `train.resume_from` can take them up. Of the stale
        sets, the newest `KEEP_STALE` are kept, and `keep` (the one this job resumes from) too.
        A finished job's checkpoints of this very fingerprint are removed: a rerun remakes them.
        Call on global rank 0 only, before the first step.
        """
        meta = self.folder / "job.json"
        if not meta.is_file():
            self._finish_moves()  # a move aside killed after it took job.json
            return None
        old = json.loads(meta.read_text())
        if old.get("fingerprint") == self.fingerprint and not old.get("finished"):
            return old.get("run_id")
        # this job holds the output folder's lock (runtime.lock), so it owns what is in it
        if old.get("fingerprint") == self.fingerprint:
            log.info("run %s in %s finished: training anew into a new run", old.get("run_id"), self.folder)
            for entry in self._own_entries():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            return None
        found = self.steps()
        moving = self.folder / f".stale-{old.get('fingerprint')}.moving"  # a move aside killed halfway
        if not found and not (self.folder / BEST_FILE).exists() and not moving.exists():  # none saved yet
            for entry in self._own_entries():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            return None
        stale = self._move_aside(str(old.get("fingerprint")))
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

    def stale_sets(self) -> list[Path]:
        """The checkpoint sets moved aside (`stale-<fingerprint>[-n]/`), newest first."""
        if not self.folder.is_dir():
            return []
        found = [p for p in self.folder.iterdir() if p.is_dir() and STALE_PATTERN.match(p.name)]
        return sorted(found, key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True)

    def _own_entries(self) -> list[Path]:
        """What the folder holds for its one fingerprint: everything but the stale sets."""
        moving = MOVING_PATTERN.match
        return [p for p in self.folder.iterdir() if not STALE_PATTERN.match(p.name) and not moving(p.name)]

    def _move_aside(self, old: str) -> Path:
        """Moves every checkpoint entry (job.json last) into `stale-<old>/`, by renames in one
        filesystem: a move killed halfway is finished by the next claim, and nothing is lost."""
        moving = self.folder / f".stale-{old}.moving"
        moving.mkdir(exist_ok=True)  # an earlier, interrupted move of this set goes on
        for entry in sorted(self._own_entries(), key=lambda p: p.name == "job.json"):
            os.replace(entry, moving / entry.name)
        return self._finish_move(moving, old)

    def _finish_move(self, moving: Path, old: str) -> Path:
        stale, n = self.folder / f"stale-{old}", 1
        while stale.exists():  # the same fingerprint moved aside before: both sets are kept
            n += 1
            stale = self.folder / f"stale-{old}-{n}"
        os.replace(moving, stale)
        os.utime(stale)  # its age is when it was moved aside (stale_sets orders by it)
        return stale

    def _finish_moves(self) -> None:
        if self.folder.is_dir():
            for moving in self.folder.iterdir():
                m = MOVING_PATTERN.match(moving.name)
                if m and moving.is_dir():
                    log.warning("finished moving %s aside: %s", moving.name, self._finish_move(moving, m.group(1)))

    def _prune_stale(self, keep: Path | None) -> None:
        """Removes the stale sets older than the newest `KEEP_STALE`, never `keep`."""
        protected = keep.resolve() if keep is not None else None
        for old in self.stale_sets()[KEEP_STALE:]:
            if old.resolve() != protected:
                log.info("removing %s: older than the newest %d checkpoint sets moved aside", old, KEEP_STALE)
                shutil.rmtree(old)

    def record(self, run_id: str | None, finished: bool = False) -> None:
        """Ties the folder to this fingerprint and run; `finished` once the job wrote its outputs."""
        atomic_write_json(
            self.folder / "job.json", {"fingerprint": self.fingerprint, "run_id": run_id, "finished": finished}
        )

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
        path = self.folder / f"step-{step:08d}.pt"

        def write() -> None:
            atomic_write_bytes(path, buf.getvalue())
            self._prune()

        self._in_background(write) if self.asynchronous else write()
        return path

    def _prune(self) -> None:
        for old in self.steps()[self.keep :]:
            old_path = self.path(old)
            shutil.rmtree(old_path) if old_path.is_dir() else old_path.unlink(missing_ok=True)

    def _save_shards(self, step: int, shards: dict[str, Any], extra: bytes) -> Path:
        import torch.distributed as tdist
        import torch.distributed.checkpoint as dcp

        path, tmp = self.folder / f"step-{step:08d}.dcp", self.folder / f".step-{step:08d}.dcp.tmp"
        main = dist.read_env().is_main
        if main:
            if tmp.exists():  # left by a save killed earlier at this step
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        dist.barrier()

        def commit() -> None:  # rank 0, once every rank's shards and the metadata are written
            if main:
                atomic_write_bytes(tmp / EXTRA_FILE, extra)
                os.replace(tmp, path)  # the commit: a folder with this name is complete
                self._prune()

        if not self.asynchronous:
            dcp.save(shards, checkpoint_id=str(tmp))  # returns once every rank's shards and the metadata are written
            commit()
            return path
        if self._group is None and tdist.is_initialized():  # every rank saves: a collective call
            self._group = tdist.new_group(backend="gloo")  # the background writes' collectives, apart from training's
        written = dcp.async_save(shards, checkpoint_id=str(tmp), process_group=self._group)  # returns once staged
        self._in_background(lambda: (written.result(), commit()))
        return path

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
            state = read_checkpoint(self.path(step))
            if state is not None and state.get("fingerprint") == self.fingerprint:
                return state
        return None


class CheckpointError(RuntimeError):
    """A checkpoint that is not damaged but cannot be loaded: the job stops with the cause."""


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """One checkpoint (a `step-*.pt` file or a sharded `step-*.dcp` folder) on the CPU, tensors and
    plain values only; None, with a warning, when it is damaged (see `Checkpointer.load_latest`)."""
    file = path / EXTRA_FILE if path.is_dir() else path
    if not file.is_file():
        log.warning("skipping damaged checkpoint %s: %s is missing (the save never completed)", path, file.name)
        return None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:
        damage = zip_damage(file)
        if damage is None:  # an intact file: the cause is systematic, and every older one has it too
            raise CheckpointError(f"checkpoint {path} is intact but cannot be loaded: {cause(exc)}") from exc
        log.warning("skipping damaged checkpoint %s: %s", path, damage)
        return None
    return {**state, "shards": str(path)} if path.is_dir() else state


def cause(exc: BaseException) -> str:
    """The line of an error that says what went wrong (torch's weights_only refusal puts it after
    a paragraph of advice), without terminal colour codes."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line] or [type(exc).__name__]
    return next((line for line in lines if "Unsupported global" in line), lines[0])


def zip_damage(file: Path) -> str | None:
    """What is wrong with the zip archive `torch.save` wrote, or None when every member reads back
    with its CRC (the archive is intact)."""
    try:
        with zipfile.ZipFile(file) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
        return f"not a readable zip archive ({exc})"
    return None if bad is None else f"{bad} fails its CRC check"
