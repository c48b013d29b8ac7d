"""What makes a checkpoint damaged, checked before it is loaded: a `torch.save` zip whose members
fail their CRC, a sharded checkpoint whose files are not the sizes recorded at save (a truncated
shard), and a `.metadata` (a pickle DCP loads) whose sha256 is not the one recorded at save."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
import zlib
from pathlib import Path
from typing import Any

SIZES_FILE = "sizes.json"  # in a sharded checkpoint: every file's size at save, checked at load
METADATA_DIGEST = "metadata.sha256"  # in a sharded checkpoint: DCP's .metadata digest, taken at save


def zip_damage(file: Path | io.BytesIO) -> str | None:
    """What is wrong with the zip archive `torch.save` wrote, or None when every member reads back
    with its CRC (the archive is intact)."""
    try:
        with zipfile.ZipFile(file) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
        return f"not a readable zip archive ({exc})"
    return None if bad is None else f"{bad} fails its CRC check"


def size_damage(files: Any, name: str) -> str | None:
    """What differs from the sizes recorded at save in a sharded checkpoint, or None."""
    if not files.is_file(f"{name}/{SIZES_FILE}"):
        return None  # saved before sizes were recorded: its .metadata digest is missing too (metadata_refusal)
    recorded, found = json.loads(files.read(f"{name}/{SIZES_FILE}")), files.sizes(name)
    for file, size in sorted(recorded.items()):
        if found.get(file) != size:
            return f"{file} is {found.get(file, 'missing')} bytes, {size} at save"
    return None


def metadata_refusal(files: Any, name: str) -> str | None:
    """Why a sharded checkpoint's `.metadata` must not be loaded, or None. DCP unpickles it: it is
    loaded only when its sha256 is the one rank 0 recorded at save (`metadata.sha256`, written
    before the commit marker); a missing digest or another one means a file changed since."""
    recorded = f"{name}/{METADATA_DIGEST}"
    if not files.is_file(recorded):
        return (
            f"checkpoint {files.at(name)} has no {METADATA_DIGEST}: its .metadata (a pickle) is not loaded "
            "unchecked; it was saved by an older scalelab, or changed since"
        )
    found = hashlib.sha256(files.read(f"{name}/.metadata")).hexdigest()
    if found != files.read(recorded).decode().strip():
        return f"checkpoint {files.at(name)}: .metadata's sha256 {found} is not the one recorded at save: not loaded"
    return None
