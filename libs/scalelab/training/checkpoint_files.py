"""Where checkpoints live: a folder on this machine's disk, or a folder in the store (fsspec).

`train.checkpoint_dir` picks it (`location`): '' is `<out>/checkpoints`; a path; an fsspec URL
(`s3://bucket/prefix`); or `store`, `<the clone's store>/checkpoints/<fingerprint>`, so a job
resumes on any machine of the lab, whatever its output folder and its local disk.

`Checkpointer` (training.checkpoint) talks to a folder through one of two classes with the same
methods, named relative to the folder:
- `LocalFiles`: a rename commits. A file is written to a temp file beside it and moved into place;
  a set of checkpoints is moved aside by renames into a hidden `.stale-<fp>.moving/`, then into
  `stale-<fp>/`.
- `RemoteFiles` (S3 and any fsspec store): there is no rename, but an object exists whole or not
  at all. A file is one PUT; a sharded checkpoint is written in place by DCP's fsspec writer, and
  its commit marker (`extra.pt`) is the object written last and removed first. A set is moved
  aside object by object (copy, then delete; `job.json` last) into the target that a marker object
  `.stale-<fp>.moving` names, so a move killed halfway is finished by the next claim.
Every failure to reach a remote store is a `StoreError`: one line naming the store.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalelab.runtime.io import atomic_write_bytes
from scalelab.runtime.paths import repo_root
from scalelab.storage import CHECKPOINTS, Store, StoreError, configured, filesystem, is_url
from scalelab.storage.store import first_line
from scalelab.training.checkpoint_checks import (  # noqa: F401 (re-exported)
    METADATA_DIGEST,
    SIZES_FILE,
    metadata_refusal,
    size_damage,
    zip_damage,
)

JOB_FILE = "job.json"
log = logging.getLogger(__name__)
STORE_KEY = "shards_store"  # a loaded sharded checkpoint's store (never saved): read_shards reaches it with it
EXTRA_FILE = MARKER = "extra.pt"  # a sharded checkpoint's commit marker: rank 0 writes it after DCP's .metadata


def checkpoint_location(value: str, out_dir: str | Path, fingerprint: str, store: Store | None) -> str:
    """The checkpoint folder `train.checkpoint_dir = value` names (a path or a URL).

    Raises:
        StoreError: `store` is asked for and this clone has no store.
    """
    if not value:
        return str(Path(out_dir) / "checkpoints")
    if value == "store":
        if store is None:
            raise StoreError(
                "train.checkpoint_dir = 'store': this clone has no store (DVC's default remote); set one with "
                "`scalelab store set URL`, or give a path or an s3:// URL"
            )
        return store.join(CHECKPOINTS, fingerprint)
    if is_url(value):
        return value
    path = Path(value.removeprefix("file://")).expanduser()
    return str(path if path.is_absolute() else repo_root() / path)


def store_of(location: str) -> Store | None:
    """The store that holds `location` (a URL), whose endpoint and credentials reach it; else None."""
    store = configured(repo_root()) if is_url(location) else None
    return store if store is not None and store.contains(location) else None


def check_location(location: str) -> None:
    """Raises StoreError unless the store that holds `location` answers and lets these credentials in."""
    if is_url(location):
        (store_of(location) or Store(location)).check()


def files_at(location: str | Path, store: Store | None = None) -> LocalFiles | RemoteFiles:
    """The folder at `location`; a URL is reached with `store`'s endpoint and credentials (default:
    this clone's store, when it holds the URL)."""
    text = str(location)
    if not is_url(text):
        return LocalFiles(Path(text))
    return RemoteFiles(text, store if store is not None and store.contains(text) else store_of(text))


class LocalFiles:
    """A checkpoint folder on a filesystem of this machine (a local disk or a shared one)."""

    remote = False

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def at(self, name: str = "") -> Path:
        return self.folder / name if name else self.folder

    def names(self) -> list[str]:
        return [p.name for p in self.folder.iterdir()] if self.folder.is_dir() else []

    def is_dir(self, name: str) -> bool:
        return (self.folder / name).is_dir()

    def is_file(self, name: str) -> bool:
        return (self.folder / name).is_file()

    def exists(self, name: str) -> bool:
        return (self.folder / name).exists()

    def source(self, name: str) -> Path:
        """What torch.load and zipfile read the file `name` from."""
        return self.folder / name

    def read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()

    def write(self, name: str, data: bytes) -> None:
        atomic_write_bytes(self.folder / name, data)

    def remove(self, name: str) -> None:
        path = self.folder / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)

    def sizes(self, name: str) -> dict[str, int]:
        """{file name: bytes} of the files in the folder `name`."""
        return {p.name: p.stat().st_size for p in (self.folder / name).iterdir() if p.is_file()}

    def age(self, name: str) -> int:
        return (self.folder / name).stat().st_mtime_ns

    def dcp(self, name: str, writing: bool) -> dict[str, Any]:
        """torch.distributed.checkpoint's keyword arguments for the sharded checkpoint `name`."""
        return {"checkpoint_id": str(self.folder / name)}

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        yield  # a local error says what it is

    def moving(self, old: str) -> bool:
        return (self.folder / f".stale-{old}.moving").exists()

    def move_aside(self, names: list[str], old: str) -> Path:
        """Moves `names` (job.json last) into `stale-<old>/`, by renames in one filesystem: a move
        killed halfway is finished by the next claim, and nothing is lost."""
        moving = self.folder / f".stale-{old}.moving"
        moving.mkdir(exist_ok=True)  # an earlier, interrupted move of this set goes on
        for name in sorted(names, key=lambda n: n == JOB_FILE):
            os.replace(self.folder / name, moving / name)
        return self._finish_move(moving, old)

    def _finish_move(self, moving: Path, old: str) -> Path:
        stale, n = self.folder / f"stale-{old}", 1
        while stale.exists():  # the same fingerprint moved aside before: both sets are kept
            n += 1
            stale = self.folder / f"stale-{old}-{n}"
        os.replace(moving, stale)
        os.utime(stale)  # its age is when it was moved aside (stale_sets orders by it)
        return stale

    def finish_moves(self, pattern) -> list[str]:
        """Finishes the moves aside a killed claim left; returns where each went."""
        done = []
        for name in self.names():
            m = pattern.match(name)
            if m and (self.folder / name).is_dir():
                done.append(f"{name}: {self._finish_move(self.folder / name, m.group(1))}")
        return done


class RemoteFiles:
    """A checkpoint folder in an object store (fsspec: s3fs for S3): no rename, whole objects."""

    remote = True

    def __init__(self, location: str, store: Store | None) -> None:
        self.location = location.rstrip("/")
        self.store = store
        self.fs, self.root = filesystem(self.location, store)
        self.options = store.options() if store is not None else {}

    def at(self, name: str = "") -> str:
        return f"{self.location}/{name}" if name else self.location

    def _key(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    def describe(self) -> str:
        return self.store.describe() if self.store is not None else self.location

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Any failure inside becomes one line naming the store (and never a 40-line traceback)."""
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: each rank's errors

        try:
            yield
        except StoreError:
            raise
        except (Exception, CheckpointException) as exc:
            raise StoreError(f"store {self.describe()}: {what} in {self.location} failed: {deepest(exc)}") from exc

    def names(self) -> list[str]:
        with self.guard("listing the checkpoints"):
            self.fs.invalidate_cache()
            try:
                found = self.fs.ls(self.root, detail=False, refresh=True)
            except FileNotFoundError:
                return []
        return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in found]

    def is_dir(self, name: str) -> bool:
        with self.guard(f"reading {name}"):
            self.fs.invalidate_cache()
            return self.fs.isdir(self._key(name))

    def is_file(self, name: str) -> bool:
        with self.guard(f"reading {name}"):
            self.fs.invalidate_cache()
            return self.fs.isfile(self._key(name))

    def exists(self, name: str) -> bool:
        with self.guard(f"reading {name}"):
            self.fs.invalidate_cache()
            return self.fs.exists(self._key(name))

    def source(self, name: str) -> io.BytesIO:
        return io.BytesIO(self.read(name))

    def read(self, name: str) -> bytes:
        with self.guard(f"reading {name}"):
            return self.fs.cat_file(self._key(name))

    def sizes(self, name: str) -> dict[str, int]:
        """{file name: bytes} of the objects in the folder `name`."""
        with self.guard(f"listing {name}"):
            self.fs.invalidate_cache()
            found = self.fs.ls(self._key(name), detail=True, refresh=True)
        return {str(e["name"]).rsplit("/", 1)[-1]: int(e["size"]) for e in found if e.get("type") == "file"}

    def write(self, name: str, data: bytes) -> None:
        """One PUT (or one multipart upload, completed last): the object exists whole or not at all."""
        with self.guard(f"writing {name}"):
            self.fs.pipe_file(self._key(name), data)

    def remove(self, name: str) -> None:
        """Removes a file or a folder; a sharded checkpoint's commit marker goes first, so a removal
        killed halfway never leaves something that looks complete."""
        with self.guard(f"removing {name}"):
            self.fs.invalidate_cache()
            key = self._key(name)
            if self.fs.isdir(key):
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(f"{key}/{MARKER}")
                self.fs.rm(key, recursive=True)
            elif self.fs.exists(key):
                self.fs.rm_file(key)

    def age(self, name: str) -> float:
        """When the set `name` was moved aside: the time of its job.json, copied last."""
        with self.guard(f"reading {name}"):
            for key in (f"{self._key(name)}/{JOB_FILE}", self._key(name)):
                with contextlib.suppress(FileNotFoundError, KeyError):
                    return self.fs.info(key)["LastModified"].timestamp()
        return 0.0

    def dcp(self, name: str, writing: bool) -> dict[str, Any]:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

        # DCP reads byte ranges of the shard files: botocore must not check a range against the
        # whole object's checksum, which S3-compatible servers (rclone) send with it
        config = {"response_checksum_validation": "when_required", "retries": {"max_attempts": 3}}
        options = {**self.options, "config_kwargs": config}
        if writing:
            return {"storage_writer": FsspecWriter(self.at(name), **options)}
        return {"storage_reader": FsspecReader(self.at(name), **options)}

    def moving(self, old: str) -> bool:
        return self.is_file(f".stale-{old}.moving")

    def move_aside(self, names: list[str], old: str) -> str:
        """Copies each entry into the stale set, then deletes it (job.json last). The target is
        picked once and kept in the marker object `.stale-<old>.moving`, removed at the end."""
        marker = f".stale-{old}.moving"
        if self.is_file(marker):  # an earlier, interrupted move of this set goes on
            target = self.read(marker).decode()
        else:
            taken, target, n = set(self.names()), f"stale-{old}", 1
            while target in taken:  # the same fingerprint moved aside before: both sets are kept
                n += 1
                target = f"stale-{old}-{n}"
            self.write(marker, target.encode())
        for name in sorted(names, key=lambda n: n == JOB_FILE):
            if name == marker:
                continue
            with self.guard(f"moving {name} to {target}"):
                src, dst = self._key(name), f"{self._key(target)}/{name}"
                self.fs.invalidate_cache()
                found = self.fs.find(src) if self.fs.isdir(src) else [src]
                for key in found:  # object by object: a copy started again overwrites, never nests
                    self.fs.copy(key, dst + key[len(src) :])
            self.remove(name)
        if not self.is_file(f"{target}/{JOB_FILE}"):  # a set moved with none: its age is the move's
            self.write(f"{target}/{JOB_FILE}", json.dumps({"moved_aside": True}).encode())
        self.remove(marker)
        return self.at(target)

    def finish_moves(self, pattern) -> list[str]:
        done = []
        for name in self.names():
            m = pattern.match(name)
            if m and self.is_file(name):
                own = [n for n in self.names() if n != name and not n.startswith(("stale-", ".stale-"))]
                done.append(f"{name}: {self.move_aside(own, m.group(1))}")
        return done


def deepest(exc: BaseException) -> str:
    """The first line of the innermost cause (DCP wraps each rank's error in its own)."""
    seen = exc
    while True:
        failures = getattr(seen, "failures", None)  # DCP's CheckpointException: {rank: wrapped error}
        if isinstance(failures, dict) and failures:
            wrapped = next(iter(failures.values()))  # (the error, its stack)
            seen = wrapped[0] if isinstance(wrapped, tuple) and isinstance(wrapped[0], BaseException) else seen
        if seen.__cause__ is None and seen.__context__ is None:
            break
        seen = seen.__cause__ or seen.__context__
    return first_line(seen) if str(seen).strip() else first_line(exc)


def cause(exc: BaseException) -> str:
    """The line of an error that says what went wrong (torch's weights_only refusal puts it after
    a paragraph of advice), without terminal colour codes."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line] or [type(exc).__name__]
    return next((line for line in lines if "Unsupported global" in line), lines[0])


class CheckpointError(RuntimeError):
    """A checkpoint that is not damaged but cannot be loaded: the job stops with the cause."""


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """One checkpoint (a `step-*.pt` file or a sharded `step-*.dcp` folder) on the CPU, tensors and
    plain values only; None, with a warning, when it is damaged (see `Checkpointer.load_latest`)."""
    return read_entry(LocalFiles(Path(path).parent), Path(path).name)


def read_entry(files: LocalFiles | RemoteFiles, name: str) -> dict[str, Any] | None:
    """`read_checkpoint` of the checkpoint `name` in `files` (a local folder or one in a store)."""
    path, sharded = files.at(name), files.is_dir(name)
    file = f"{name}/{EXTRA_FILE}" if sharded else name
    if not files.is_file(file):
        log.warning("skipping damaged checkpoint %s: %s is missing (the save never completed)", path, EXTRA_FILE)
        return None
    source = files.source(file)
    try:
        import torch

        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:
        damage = zip_damage(source)
        if damage is None:  # an intact file: the cause is systematic, and every older one has it too
            raise CheckpointError(f"checkpoint {path} is intact but cannot be loaded: {cause(exc)}") from exc
        log.warning("skipping damaged checkpoint %s: %s", path, damage)
        return None
    if not sharded:
        return state
    if damage := size_damage(files, name):  # a truncated shard: DCP would fail on every try
        log.warning("skipping damaged checkpoint %s: %s", path, damage)
        return None
    return {**state, "shards": str(path), **({STORE_KEY: files.store} if files.remote else {})}
