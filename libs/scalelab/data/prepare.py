"""Data preparation: real (digits), synthetic and user files -> data/prepared/.

`prepare()` writes `train.pt`, `val.pt` and `test.pt` (each {"x": float32, "y": int64}) and then
`manifest.json`, which records shapes, the sha256 of every file and the params that produced them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from scalelab.config import ConfigError, DataConfig, to_dict
from scalelab.data.store import MANIFEST
from scalelab.runtime.io import atomic_write_bytes, atomic_write_json, sha256_file


def load_source(cfg: DataConfig) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Returns features (float32), labels (int64, 0..C-1) and the per-sample input shape."""
    if cfg.source == "digits":
        from sklearn.datasets import load_digits  # ships its data: no download

        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        return x, torch.tensor(digits.target, dtype=torch.int64), [1, 8, 8]
    if cfg.source == "synthetic":
        return (*synthetic(cfg.synthetic.num_samples, cfg.synthetic.num_features,
                           cfg.synthetic.num_classes, cfg.synthetic.noise, cfg.seed),
                [cfg.synthetic.num_features])
    return _read_file(cfg.file.path, cfg.file.label_column)


def synthetic(num_samples: int, num_features: int, num_classes: int, noise: float,
              seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian blobs: a random centre per class plus `noise`-scaled noise, from one seed."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_classes, num_features, generator=gen) * 2.0
    y = torch.randint(num_classes, (num_samples,), generator=gen)
    x = centres[y] + noise * torch.randn(num_samples, num_features, generator=gen)
    return x, y


def _read_file(path: str, label_column: str) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    import pandas as pd

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"data.file.path = {path!r}: the file does not exist")
    if file.suffix.lower() not in (".csv", ".parquet", ".pq"):
        raise ConfigError(f"data.file.path = {path!r}: expected a .csv or .parquet file")
    frame = pd.read_csv(file) if file.suffix.lower() == ".csv" else pd.read_parquet(file)
    if label_column not in frame.columns:
        raise ConfigError(f"data.file.label_column = {label_column!r} is not a column of {path}; "
                          f"columns: {', '.join(map(str, frame.columns))}")
    features = frame.drop(columns=[label_column])
    bad = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    if bad:
        raise ConfigError(f"{path}: feature columns must be numeric; not numeric: {bad}")
    codes, _ = pd.factorize(frame[label_column], sort=True)
    x = torch.tensor(features.to_numpy(dtype="float32"))
    return x, torch.tensor(codes, dtype=torch.int64), [x.shape[1]]


def split(n: int, val_fraction: float, test_fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """A seeded permutation cut into train/val/test index sets."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test, n_val = max(1, round(n * test_fraction)), max(1, round(n * val_fraction))
    return {"test": perm[:n_test], "val": perm[n_test:n_test + n_val], "train": perm[n_test + n_val:]}


def prepare(cfg: DataConfig, out_dir: str | Path) -> dict[str, Any]:
    """Builds the splits and writes them with their manifest; returns the manifest."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # no manifest until every file is complete
    x, y, input_shape = load_source(cfg)
    files = {}
    for name, idx in split(len(y), cfg.val_fraction, cfg.test_fraction, cfg.seed).items():
        path = out / f"{name}.pt"
        atomic_write_bytes(path, _tensor_bytes({"x": x[idx].contiguous(), "y": y[idx].contiguous()}))
        files[name] = {"file": path.name, "sha256": sha256_file(path), "num_samples": len(idx),
                       "x_shape": list(x[idx].shape)}
    manifest = {"source": cfg.source, "input_shape": input_shape,
                "num_classes": int(y.max()) + 1, "splits": files, "params": to_dict(cfg)}
    atomic_write_json(out / MANIFEST, manifest)
    return manifest


def _tensor_bytes(obj: Any) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
