"""Prepared data on disk: the manifest, its check, and a split as a dataset object.

Training and evaluation call `verify()` first: a missing or corrupt file is a `DataError` that names
the file and the command that rebuilds it. `verify` is the start-up check (size, header, and the
sha256 of small files or a probe of large ones: scalelab.data.arrays); `verify(full=True)` hashes
every byte (`scalelab verify-data`).

A split is a `Split`: its length, `fetch(indices)` (one batch, as tensors) and its manifest entry.
A DataLoader worker fetches the batch as NumPy arrays in their stored dtypes (`fetch_arrays`: they
cross to the rank as a few KB of pickled bytes, cheaper than torch's shared-memory handles for
small batches), and the rank turns them into tensors (`to_tensors`).
`open_split` maps its files read-only (`np.load(mmap_mode="r")`): every rank of a job shares the
page cache, and no rank's anonymous memory grows with the data. The loader, training and evaluation
take a `Split`, never raw tensors; `FeatureSplit.from_arrays` wraps arrays already in memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalelab.data.arrays import check_file, open_array

FORMAT = 2  # 1: one torch .pt file per split, loaded whole
SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"
REBUILD = "dvc repro prepare (or: scalelab prepare --params params.yaml --out {dir})"


class DataError(RuntimeError):
    """Prepared data is missing, corrupt or inconsistent; the message says how to rebuild it."""

    exit_status = 2  # the CLI's "bad input"


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    root = Path(data_dir)
    fix = REBUILD.format(dir=root)
    path = root / MANIFEST
    if not path.is_file():
        raise DataError(f"{path} is missing: the prepared data is incomplete; run {fix}")
    try:
        manifest = json.loads(path.read_text())
        splits = {name: manifest["splits"][name]["arrays"] for name in SPLITS}
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path} is corrupt or of an older format ({exc!r} missing); run {fix}") from None
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path} is format {manifest.get('format', 1)}, this scalelab reads format {FORMAT}; run {fix}")
    if not all(splits.values()):
        raise DataError(f"{path} lists a split without files; run {fix}")
    return manifest


def verify(data_dir: str | Path, *, full: bool = False) -> dict[str, Any]:
    """Checks the manifest and every file it lists; returns the manifest.

    Args:
        data_dir: the prepared-data folder.
        full: hash every byte of every file; otherwise size, header, and the sha256 of files under
            32 MiB or a 1 MiB probe of larger ones (milliseconds whatever the size).

    Raises:
        DataError: naming the missing or corrupt file and the command that rebuilds it.
    """
    root = Path(data_dir)
    manifest = read_manifest(root)
    for name in SPLITS:
        for entry in manifest["splits"][name]["arrays"].values():
            problem = check_file(root, entry, full=full)
            if problem:
                raise DataError(f"{problem} ({root / MANIFEST}); run {REBUILD.format(dir=root)}")
    return manifest


def recorded_hashes(manifest: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """{file name: (md5, sha256)} of every array, as prepare computed them."""
    return {
        entry["file"]: (entry["md5"], entry["sha256"])
        for split in manifest["splits"].values()
        for entry in split["arrays"].values()
    }


def open_split(data_dir: str | Path, name: str, manifest: dict[str, Any], *, seq_len: int | None = None) -> Split:
    """One verified split, memory-mapped; token splits need the model's `seq_len`."""
    entry = manifest["splits"][name]
    paths = {key: Path(data_dir) / e["file"] for key, e in entry["arrays"].items()}
    if manifest["kind"] == "tokens":
        if seq_len is None:
            raise ValueError("a token split needs seq_len: the sequence length of the model")
        return TokenSplit(paths, entry, seq_len)
    return FeatureSplit(paths, entry)


class Split(torch.utils.data.Dataset):
    """A split: `len`, `fetch(indices)` -> (inputs, targets) tensors, and its manifest `entry`.

    Its arrays are opened on first use and reopened after pickling (a DataLoader worker started
    with spawn maps the files itself instead of receiving a copy).
    """

    kind = ""

    def __init__(self, paths: dict[str, Path] | None, entry: dict[str, Any]) -> None:
        self.paths, self.entry = paths, entry
        self._arrays: dict[str, np.ndarray] | None = None

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            self._arrays = {key: open_array(path) for key, path in (self.paths or {}).items()}
        return self._arrays

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.paths is not None:
            state["_arrays"] = None
        return state

    def fetch_arrays(self, indices: np.ndarray) -> tuple[np.ndarray, ...]:
        """One batch as NumPy arrays in their stored dtypes (one gather from the map each)."""
        raise NotImplementedError

    def to_tensors(self, arrays: tuple[np.ndarray, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """`fetch_arrays`' batch as (inputs, targets) tensors."""
        raise NotImplementedError

    def fetch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch: (inputs, targets) for the samples at `indices`, in that order."""
        return self.to_tensors(self.fetch_arrays(np.asarray(indices, dtype=np.int64)))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.fetch(np.array([i]))
        return x[0], y[0]

    def __getitems__(self, indices: Any) -> tuple[np.ndarray, ...]:
        """A DataLoader's batched fetch, one call per batch: NumPy arrays (see `to_tensors`)."""
        return self.fetch_arrays(np.asarray(indices, dtype=np.int64))


class FeatureSplit(Split):
    """Rows of features (float32) and their class codes (int64)."""

    kind = "features"

    @classmethod
    def from_arrays(cls, x: np.ndarray, y: np.ndarray) -> FeatureSplit:
        split = cls(None, {"num_samples": len(y)})
        split._arrays = {"x": np.asarray(x, dtype=np.float32), "y": np.asarray(y, dtype=np.int64)}
        return split

    def __len__(self) -> int:
        return int(self.entry["num_samples"])

    def fetch_arrays(self, indices: np.ndarray) -> tuple[np.ndarray, ...]:
        return np.ascontiguousarray(self.arrays["x"][indices]), np.ascontiguousarray(self.arrays["y"][indices])

    def to_tensors(self, arrays: tuple[np.ndarray, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = arrays
        return torch.from_numpy(x), torch.from_numpy(y)


class TokenSplit(Split):
    """A token stream cut into samples of `seq_len` + 1 tokens: sample i starts at token i x seq_len
    (inputs: its first seq_len tokens; targets: the same shifted by one), so every token but the
    first is a target exactly once per epoch."""

    kind = "tokens"

    def __init__(self, paths: dict[str, Path], entry: dict[str, Any], seq_len: int) -> None:
        super().__init__(paths, entry)
        self.seq_len = seq_len

    def __len__(self) -> int:
        return max((int(self.entry["num_tokens"]) - 1) // self.seq_len, 0)

    @property
    def bytes_per_token(self) -> float:
        return int(self.entry["num_bytes"]) / max(int(self.entry["num_tokens"]), 1)

    def fetch_arrays(self, indices: np.ndarray) -> tuple[np.ndarray, ...]:
        windows = indices[:, None] * self.seq_len + np.arange(self.seq_len + 1)
        return (np.ascontiguousarray(self.arrays["tokens"][windows]),)  # (batch, seq_len + 1), stored dtype

    def to_tensors(self, arrays: tuple[np.ndarray, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.from_numpy(arrays[0].astype(np.int64))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
