"""Prepared data on disk: the manifest, its check, and loading a split.

Training and evaluation call `verify()` first: a missing or corrupt file is a `DataError` that names
the file and the command that rebuilds it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from scalelab.runtime.io import sha256_file

SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"
REBUILD = "dvc repro prepare (or: scalelab prepare --params params.yaml --out {dir})"


class DataError(RuntimeError):
    """Prepared data is missing, corrupt or inconsistent; the message says how to rebuild it."""

    exit_status = 2  # the CLI's "bad input"


def verify(data_dir: str | Path) -> dict[str, Any]:
    """Checks the manifest and every file's sha256; returns the manifest.

    Raises:
        DataError: naming the missing or corrupt file and the command that rebuilds it.
    """
    root = Path(data_dir)
    fix = REBUILD.format(dir=root)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise DataError(f"{manifest_path} is missing: the prepared data is incomplete; run {fix}")
    try:
        manifest = json.loads(manifest_path.read_text())
        splits = manifest["splits"]
    except (ValueError, KeyError) as exc:
        raise DataError(f"{manifest_path} is corrupt ({exc}); run {fix}") from None
    for name in SPLITS:
        path = root / splits[name]["file"]
        if not path.is_file():
            raise DataError(f"{path} is missing; run {fix}")
        if sha256_file(path) != splits[name]["sha256"]:
            raise DataError(f"{path} is corrupt: its sha256 does not match {manifest_path}; run {fix}")
    return manifest


def load_split(data_dir: str | Path, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Loads one verified split as (x, y)."""
    blob = torch.load(Path(data_dir) / f"{name}.pt", weights_only=True)
    return blob["x"], blob["y"]


class TensorPairs(torch.utils.data.Dataset):
    """In-memory (x, y) pairs that a DataLoader fetches a whole batch at a time."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    def __getitems__(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(idx)
        return self.x[index], self.y[index]
