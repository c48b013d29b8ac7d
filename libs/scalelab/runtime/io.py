"""Atomic file writes, and the project's hashes of files and of JSON-able values.

A write goes to a temp file in the same folder, is fsynced, then moved over the target with
os.replace: a reader never sees a half-written file, only the old one or the new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def file_digests(path: str | Path, *names: str) -> list[str]:
    """Hex digests of one file for each hashlib algorithm in `names`, reading it once in 1 MiB chunks."""
    digests = [hashlib.new(name) for name in names]
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            for digest in digests:
                digest.update(chunk)
    return [d.hexdigest() for d in digests]


def sha256_file(path: str | Path) -> str:
    return file_digests(path, "sha256")[0]


def json_digest(obj: Any, *, drop: tuple[str, ...] = (), length: int = 64) -> str:
    """sha256 of `obj` as canonical JSON (sorted keys), leaving out the top-level keys in `drop`."""
    if drop and isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if k not in drop}
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:length]
