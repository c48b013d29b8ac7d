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
    """Reads and checks a user's table: every problem is a ConfigError naming the file and column."""
    import numpy as np
    import pandas as pd

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"data.file.path = {path!r}: the file does not exist")
    if file.suffix.lower() not in (".csv", ".parquet", ".pq"):
        raise ConfigError(f"data.file.path = {path!r}: expected a .csv or .parquet file")
    try:
        frame = pd.read_csv(file) if file.suffix.lower() == ".csv" else pd.read_parquet(file)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as exc:
        raise ConfigError(f"data.file.path = {path!r}: the file cannot be read as a table: {exc}") from None
    if label_column not in frame.columns:
        raise ConfigError(f"data.file.label_column = {label_column!r} is not a column of {path}; "
                          f"columns: {', '.join(map(str, frame.columns))}")
    if frame.empty:
        raise ConfigError(f"{path}: the table has a header but no rows")
    features = frame.drop(columns=[label_column])
    if features.shape[1] == 0:
        raise ConfigError(f"{path}: no feature columns besides the label column {label_column!r}")
    bad = [str(c) for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    if bad:
        raise ConfigError(f"{path}: column {bad[0]!r} is not numeric (feature columns must be numbers); "
                          f"not numeric: {bad}")
    values = features.to_numpy(dtype="float64")
    for j, column in enumerate(features.columns):
        rows = np.flatnonzero(~np.isfinite(values[:, j]))
        if len(rows):
            raise ConfigError(f"{path}: column {str(column)!r} holds {values[rows[0], j]} (NaN or inf) in "
                              f"{len(rows)} row(s), the first at data row {rows[0] + 1}; clean or drop them")
    labels = frame[label_column]
    if labels.isna().any():
        raise ConfigError(f"{path}: label column {label_column!r} is empty in {int(labels.isna().sum())} row(s), "
                          f"the first at data row {int(np.flatnonzero(labels.isna())[0]) + 1}")
    if labels.nunique() < 2:
        raise ConfigError(f"{path}: label column {label_column!r} holds a single class ({labels.iloc[0]!r}); "
                          "a classifier needs two or more")
    codes, _ = pd.factorize(labels, sort=True)
    x = torch.tensor(values, dtype=torch.float32)
    return x, torch.tensor(codes, dtype=torch.int64), [x.shape[1]]


def split(n: int, val_fraction: float, test_fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """A seeded permutation cut into train/val/test index sets."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test, n_val = max(1, round(n * test_fraction)), max(1, round(n * val_fraction))
    return {"test": perm[:n_test], "val": perm[n_test:n_test + n_val], "train": perm[n_test + n_val:]}


def prepare(cfg: DataConfig, out_dir: str | Path, min_train_samples: int = 1) -> dict[str, Any]:
    """Builds the splits and writes them with their manifest; returns the manifest.

    Everything is read and checked before the first file is touched, so bad input leaves `out_dir`
    as it was. `min_train_samples` is the training job's global batch: a smaller training split is
    refused here, before any training process starts.
    """
    out = Path(out_dir)
    x, y, input_shape = load_source(cfg)
    splits = split(len(y), cfg.val_fraction, cfg.test_fraction, cfg.seed)
    if len(splits["train"]) < min_train_samples:
        source = cfg.file.path if cfg.source == "file" else f"data.source {cfg.source!r}"
        raise ConfigError(f"{source}: the training split has {len(splits['train'])} samples, fewer than one global "
                          f"batch of {min_train_samples} (train.batch_size x grad_accum_steps x processes); "
                          "add data or lower train.batch_size")
    scaling = None
    if cfg.source == "file" and cfg.file.standardize:  # z-scores fitted on the training split only
        mean, std = x[splits["train"]].mean(0), x[splits["train"]].std(0)
        std = torch.where(std > 0, std, torch.ones_like(std))
        x = (x - mean) / std
        scaling = {"mean": mean.tolist(), "std": std.tolist(), "fitted_on": "train"}
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # no manifest until every file is complete
    files = {}
    for name, idx in splits.items():
        path = out / f"{name}.pt"
        atomic_write_bytes(path, _tensor_bytes({"x": x[idx].contiguous(), "y": y[idx].contiguous()}))
        files[name] = {"file": path.name, "sha256": sha256_file(path), "num_samples": len(idx),
                       "x_shape": list(x[idx].shape)}
    manifest = {"source": cfg.source, "input_shape": input_shape, "num_classes": int(y.max()) + 1,
                "splits": files, "params": to_dict(cfg), "standardize": scaling}
    atomic_write_json(out / MANIFEST, manifest)
    return manifest


def _tensor_bytes(obj: Any) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
