"""A run's prepared data and weights, back from the lab's store by the hashes the run recorded.

DVC keeps every pushed file in the store under its md5 (`<store>/files/md5/ab/cdef...`, a folder
as a `.dir` listing of its files' md5s). A training run records the md5 of its data folder
(`data.md5`) with every file's sha256 (`data.sha256.<file>`), and the md5 and sha256 of `model.pt`
and `best.pt` (`outputs.<file>.md5`, `.sha256`). `fetch` reads those objects straight from the
store (no git checkout, no DVC cache: any clone pointed at the store and the tracking server can),
checks each file's md5 and sha256 as it arrives, and only then moves it into place.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from scalelab.runtime.io import file_digests
from scalelab.storage import Store, configured, filesystem
from scalelab.tracking import provenance, tracking_uri
from scalelab.tracking.secrets import mask_uri

WEIGHTS = ("model.pt", "best.pt")


class FetchError(RuntimeError):
    """The run, its hashes or its objects cannot be found: said in one line, nothing written."""

    exit_status = 2


class Mismatch(RuntimeError):
    """A fetched file's hash is not the one the run recorded (the file is not kept)."""

    exit_status = 1


def fetch(run_id: str, repo: Path, out: Path) -> list[Path]:
    """Writes the run's data folder under `out/<data.path>` and its weights under `out`; returns
    the files written, each checked against the run's hashes."""
    tags = run_tags(run_id)
    store = configured(repo)
    if store is None:
        raise FetchError(f"{repo}: no store (DVC default remote) to fetch run {run_id} from; scalelab store set URL")
    store.check()
    wanted = planned(run_id, tags, store)
    written = []
    for rel, md5, sha256 in wanted:
        written.append(download(store, md5, sha256, out / rel, run_id))
    return written


def run_tags(run_id: str) -> dict[str, str]:
    from scalelab.tracking import runs

    try:
        return runs.tags(run_id)
    except Exception as exc:
        uri = mask_uri(tracking_uri())
        raise FetchError(f"run {run_id!r} is not in the tracking store {uri}: {mask_uri(first_line(exc))}") from None


def planned(run_id: str, tags: dict[str, str], store: Store) -> list[tuple[str, str, str]]:
    """(path under out, md5, sha256) of every file to fetch: the data folder's files, then the weights."""
    data_md5, data_path = tags.get("data.md5"), tags.get("data.path", "data/prepared")
    if not data_md5 or Path(data_path).is_absolute() or ".." in Path(data_path).parts:
        raise FetchError(f"run {run_id} records no data folder inside the repository (data.md5, data.path)")
    listing = json.loads(read_object(store, data_md5, f"the listing of {data_path}", run_id))
    hashes = {e["relpath"]: (e["md5"], "") for e in listing}
    if provenance.dvc_dir_md5(hashes) != data_md5:
        raise Mismatch(f"the store's listing {data_md5} of {data_path} does not hash to its name")
    files = []
    for entry in listing:
        sha256 = tags.get(f"data.sha256.{entry['relpath']}")
        if sha256 is None:
            raise FetchError(f"run {run_id} records no sha256 for {data_path}/{entry['relpath']}")
        files.append((f"{data_path}/{entry['relpath']}", entry["md5"], sha256))
    for name in WEIGHTS:
        md5, sha256 = tags.get(f"outputs.{name}.md5"), tags.get(f"outputs.{name}.sha256")
        if not (md5 and sha256):
            raise FetchError(
                f"run {run_id} records no hash of {name} (outputs.{name}.md5: runs since the store landed): "
                f"check out the commit whose dvc.lock records its outputs (after its git.commit "
                f"{tags.get('git.commit', '?')[:12]}) and run `dvc pull`"
            )
        files.append((name, md5, sha256))
    return files


def object_path(store: Store, md5: str) -> tuple[Any, str]:
    fs, base = filesystem(store.url, store)
    return fs, f"{base.rstrip('/')}/files/md5/{md5[:2]}/{md5[2:]}"


def read_object(store: Store, md5: str, what: str, run_id: str) -> bytes:
    fs, path = object_path(store, md5)
    try:
        return fs.cat_file(path)
    except FileNotFoundError:
        raise missing(store, md5, what, run_id) from None


def missing(store: Store, md5: str, what: str, run_id: str) -> FetchError:
    return FetchError(
        f"store {store.describe()} has no object {md5} ({what} of run {run_id}): "
        "was `dvc push` run where it was trained?"
    )


def download(store: Store, md5: str, sha256: str, dest: Path, run_id: str) -> Path:
    """The object `md5` at `dest`, once its md5 and sha256 are the recorded ones (temp file, then rename)."""
    fs, path = object_path(store, md5)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    try:
        try:
            fs.get_file(path, tmp)
        except FileNotFoundError:
            raise missing(store, md5, dest.name, run_id) from None
        got_md5, got_sha256 = file_digests(tmp, "md5", "sha256")
        if (got_md5, got_sha256) != (md5, sha256):
            raise Mismatch(
                f"{dest.name} from store {store.describe()}: md5 {got_md5}, sha256 {got_sha256[:16]}..., "
                f"but run {run_id} recorded md5 {md5}, sha256 {sha256[:16]}...; not kept"
            )
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


__all__ = ["FetchError", "Mismatch", "fetch"]
