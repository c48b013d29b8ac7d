"""The prepared-data file format: `.npy` arrays written in a stream, read memory-mapped.

Each array of a split is one `.npy` file (NumPy's own format: a short header with dtype and
shape, then the raw C-ordered values), so `np.load(path, mmap_mode="r")` maps it without reading
it, and any tool that reads `.npy` reads it. `NpyWriter` appends rows as they come and writes the
final length into the header at the end: NumPy pads the header so that the first axis can grow in
place, which is what makes a streamed `.npy` possible without a second copy.

Every file gets an entry in the manifest (`file_entry`): dtype, shape, bytes, sha256 and md5 (read
once, here), and a probe digest over its size and 16 blocks of 64 KiB spread over the file.
`check_file` is the check at start-up: size and header always; the full sha256 for a file under
`FULL_CHECK_BELOW_BYTES` (milliseconds), the probe digest above it (about 1 MiB read whatever the
size: a 10 GB split is checked in milliseconds, not the ~20 s a full read takes). `check_file(...,
full=True)` hashes every byte (`scalelab verify-data`, and `scalelab reproduce` does the same).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.runtime.io import file_digests

PROBE_BLOCKS = 16
PROBE_BLOCK_BYTES = 64 << 10
FULL_CHECK_BELOW_BYTES = 32 << 20  # smaller files are hashed whole at start-up


class NpyWriter:
    """Appends rows of one dtype and row shape to a `.npy` file whose first axis grows.

    Memory stays that of the chunk being appended. Call `close()` to write the final shape;
    until then the header says 0 rows, so a file left by a killed writer reads as empty.
    """

    def __init__(self, path: str | Path, dtype: Any, row_shape: tuple[int, ...] = ()) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(row_shape)
        self.rows = 0
        self._fh = self.path.open("wb")
        self._data_offset = self._write_header()

    def _write_header(self) -> int:
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.rows, *self.row_shape),
        }
        self._fh.seek(0)
        np.lib.format.write_array_header_1_0(self._fh, header)  # padded: room for 21 digits of rows
        return self._fh.tell()

    def append(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.row_shape:
            raise ValueError(f"{self.path.name}: rows of shape {rows.shape[1:]}, expected {self.row_shape}")
        if rows.size:
            self._fh.write(memoryview(rows).cast("B"))
        self.rows += len(rows)

    def close(self) -> None:
        """Writes the final shape into the header and flushes the file to disk."""
        end = self._fh.tell()
        if self._write_header() != self._data_offset:  # NumPy's padding guarantees it; never silently shift
            raise RuntimeError(f"{self.path}: the .npy header changed length")
        self._fh.seek(end)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()

    def abort(self) -> None:
        self._fh.close()
        self.path.unlink(missing_ok=True)


def read_header(path: str | Path) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, data offset in bytes) of a `.npy` file, reading its header only."""
    with Path(path).open("rb") as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        if fortran:
            raise ValueError("Fortran-ordered array")
        return dtype, tuple(shape), fh.tell()


def open_array(path: str | Path) -> np.ndarray:
    """The array memory-mapped read-only (an empty array when it has no rows: mmap needs a byte)."""
    dtype, shape, _ = read_header(path)
    if 0 in shape:
        return np.empty(shape, dtype=dtype)
    return np.load(path, mmap_mode="r")


def probe_digest(path: str | Path) -> str:
    """sha256 of the file's size and PROBE_BLOCKS blocks of PROBE_BLOCK_BYTES spread evenly over it
    (the first holds the header, the last ends the file)."""
    size = Path(path).stat().st_size
    digest = hashlib.sha256(str(size).encode())
    last = max(size - PROBE_BLOCK_BYTES, 0)
    offsets = sorted({round(i * last / (PROBE_BLOCKS - 1)) for i in range(PROBE_BLOCKS)})
    with Path(path).open("rb") as fh:
        for offset in offsets:
            fh.seek(offset)
            digest.update(fh.read(PROBE_BLOCK_BYTES))
    return digest.hexdigest()


def file_entry(path: str | Path) -> dict[str, Any]:
    """The manifest entry of a finished `.npy` file: read once for sha256 and md5 (DVC's hash)."""
    path = Path(path)
    dtype, shape, _ = read_header(path)
    sha256, md5 = file_digests(path, "sha256", "md5")
    return {
        "file": path.name,
        "dtype": dtype.str,
        "shape": list(shape),
        "bytes": path.stat().st_size,
        "sha256": sha256,
        "md5": md5,
        "probe_sha256": probe_digest(path),
    }


def check_file(root: Path, entry: dict[str, Any], *, full: bool = False) -> str | None:
    """What is wrong with one array file against its manifest entry, or None.

    Always: present, its size, dtype and shape. Then the full sha256 when `full` or when the file is
    under FULL_CHECK_BELOW_BYTES, else the probe digest.
    """
    path = root / entry["file"]
    if not path.is_file():
        return f"{path} is missing"
    size = path.stat().st_size
    if size != entry["bytes"]:
        return f"{path} is corrupt: {size} bytes, the manifest says {entry['bytes']}"
    try:
        dtype, shape, _ = read_header(path)
    except (ValueError, OSError) as exc:
        return f"{path} is corrupt: its .npy header cannot be read ({exc})"
    if dtype.str != entry["dtype"] or list(shape) != entry["shape"]:
        said = f"{entry['dtype']} {entry['shape']}"
        return f"{path} is corrupt: its header says {dtype.str} {list(shape)}, the manifest {said}"
    if full or size < FULL_CHECK_BELOW_BYTES:
        if file_digests(path, "sha256")[0] != entry["sha256"]:
            return f"{path} is corrupt: its sha256 does not match the manifest"
    elif probe_digest(path) != entry["probe_sha256"]:
        return f"{path} is corrupt: its sampled blocks do not match the manifest's probe sha256"
    return None
