"""Feature sources (digits, synthetic, a CSV or Parquet table) as streams of row chunks.

`feature_source(cfg)` checks its input first (a table is read once for that, in chunks) and
returns the row count, the row shape, the classes and `chunks()`: the rows again, as
(float32 features, int64 labels) chunks of at most CHUNK_ROWS. Memory holds one chunk, never the
table. Every problem with a user's table is a ConfigError naming the file and the column.
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.config import ConfigError, DataConfig

CHUNK_ROWS = 1 << 16
Chunk = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class FeatureSource:
    num_rows: int
    row_shape: tuple[int, ...]
    num_classes: int
    chunks: Callable[[], Iterator[Chunk]]
    classes: list[Any] = field(default_factory=list)  # a table's label values, in code order


def feature_source(cfg: DataConfig) -> FeatureSource:
    """The rows of `data.source`: a feature source of config/names.py, never another as a fallback."""
    return FEATURE_READERS[cfg.source](cfg)


def _synthetic(cfg: DataConfig) -> FeatureSource:
    s = cfg.synthetic
    return FeatureSource(
        s.num_samples,
        (s.num_features,),
        s.num_classes,
        lambda: synthetic_chunks(s.num_samples, s.num_features, s.num_classes, s.noise, cfg.seed),
    )


def _digits() -> FeatureSource:
    images, target = digits_arrays()
    x = (images[:, None] / 16.0).astype(np.float32)
    y = target.astype(np.int64)
    return FeatureSource(len(y), (1, 8, 8), int(y.max()) + 1, lambda: iter([(x, y)]))


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (images, target), as `sklearn.datasets.load_digits` returns them:
    read from the CSV scikit-learn ships (datasets/data/digits.csv.gz) the way load_digits reads
    it, without importing scikit-learn (about 1.5 CPU-seconds of every `prepare`); load_digits
    itself where an install keeps the file elsewhere. Nothing is downloaded either way."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.images, digits.target
    with gzip.open(path) as rows:
        table = np.loadtxt(rows, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)


def synthetic_chunks(num_samples: int, num_features: int, num_classes: int, noise: float, seed: int) -> Iterator[Chunk]:
    """Gaussian blobs: a random centre per class plus `noise`-scaled noise; chunk k draws from
    (seed, k), so the rows do not depend on who reads them or how."""
    centres = np.random.default_rng([seed, 0]).standard_normal((num_classes, num_features)) * 2.0
    for k, start in enumerate(range(0, num_samples, CHUNK_ROWS)):
        rng = np.random.default_rng([seed, 1, k])
        n = min(CHUNK_ROWS, num_samples - start)
        y = rng.integers(num_classes, size=n, dtype=np.int64)
        x = centres[y] + noise * rng.standard_normal((n, num_features))
        yield x.astype(np.float32), y


# ---- user tables ----


def _open_table(path: str) -> tuple[list[str], Callable[[], Iterator[Any]]]:
    """(column names, a function that yields the table as pandas chunks)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"data.file.path = {path!r}: the file does not exist")
    suffix = file.suffix.lower()
    if suffix not in (".csv", ".parquet", ".pq"):
        raise ConfigError(f"data.file.path = {path!r}: expected a .csv or .parquet file")
    try:
        if suffix == ".csv":
            columns = list(pd.read_csv(file, nrows=0).columns)
            return columns, lambda: iter(pd.read_csv(file, chunksize=CHUNK_ROWS))
        table = pq.ParquetFile(file)
        return table.schema_arrow.names, lambda: (b.to_pandas() for b in table.iter_batches(CHUNK_ROWS))
    except (
        pd.errors.EmptyDataError,
        pd.errors.ParserError,
        UnicodeDecodeError,
        ValueError,
        OSError,
        pa.ArrowException,
    ) as exc:
        raise ConfigError(f"data.file.path = {path!r}: the file cannot be read as a table: {exc}") from None


class _TableCheck:
    """What one pass over a table finds: rows, bad values per column, labels."""

    def __init__(self, path: str, label: str) -> None:
        self.path, self.label = path, label
        self.rows = 0
        self.non_finite: dict[str, tuple[int, float, int]] = {}  # column -> (first row, value, count)
        self.empty_labels: tuple[int, int] | None = None  # (first row, count)
        self.labels: set[Any] = set()
        self.first_label: Any = None

    def add(self, chunk: Any) -> None:
        import pandas as pd

        if chunk.empty:  # a header-only CSV reads as one empty chunk of text columns
            return
        features = chunk.drop(columns=[self.label])
        bad = [str(c) for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
        if bad:
            raise ConfigError(
                f"{self.path}: column {bad[0]!r} is not numeric (feature columns must be numbers); not numeric: {bad}"
            )
        values = features.to_numpy(dtype="float64")
        for j, column in enumerate(map(str, features.columns)):
            rows = np.flatnonzero(~np.isfinite(values[:, j]))
            if len(rows):
                first, value, count = self.non_finite.get(column, (self.rows + rows[0], values[rows[0], j], 0))
                self.non_finite[column] = (first, value, count + len(rows))
        labels = chunk[self.label]
        empty = np.flatnonzero(labels.isna().to_numpy())
        if len(empty):
            first, count = self.empty_labels or (self.rows + empty[0], 0)
            self.empty_labels = (first, count + len(empty))
        if self.first_label is None and len(labels):
            first = labels.iloc[0]
            self.first_label = first.item() if isinstance(first, np.generic) else first
        self.labels.update(labels.dropna().unique().tolist())
        self.rows += len(chunk)

    def raise_first_problem(self, columns: list[str]) -> None:
        if self.rows == 0:
            raise ConfigError(f"{self.path}: the table has a header but no rows")
        for column in columns:
            if column in self.non_finite:
                first, value, count = self.non_finite[column]
                raise ConfigError(
                    f"{self.path}: column {column!r} holds {value} (NaN or inf) in {count} row(s), "
                    f"the first at data row {first + 1}; clean or drop them"
                )
        if self.empty_labels:
            first, count = self.empty_labels
            raise ConfigError(
                f"{self.path}: label column {self.label!r} is empty in {count} row(s), "
                f"the first at data row {first + 1}"
            )
        if len(self.labels) < 2:
            raise ConfigError(
                f"{self.path}: label column {self.label!r} holds a single class ({self.first_label!r}); "
                "a classifier needs two or more"
            )


def _table(path: str, label: str) -> FeatureSource:
    """Checks the whole table in one streamed pass, then serves it again chunk by chunk."""
    import pandas as pd

    columns, read = _open_table(path)
    if label not in columns:
        raise ConfigError(
            f"data.file.label_column = {label!r} is not a column of {path}; columns: {', '.join(columns)}"
        )
    features = [c for c in map(str, columns) if c != label]
    if not features:
        raise ConfigError(f"{path}: no feature columns besides the label column {label!r}")
    check = _TableCheck(path, label)
    try:
        for chunk in read():
            check.add(chunk)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"data.file.path = {path!r}: the file cannot be read as a table: {exc}") from None
    check.raise_first_problem(features)
    classes = pd.Index(pd.factorize(pd.Series(list(check.labels)), sort=True)[1])

    def chunks() -> Iterator[Chunk]:
        for chunk in filter(lambda c: not c.empty, read()):
            x = chunk.drop(columns=[label]).to_numpy(dtype=np.float32)
            yield x, classes.get_indexer(chunk[label]).astype(np.int64)

    return FeatureSource(check.rows, (len(features),), len(classes), chunks, classes.tolist())


# each feature source of config/names.py: its reader (the same keys as the registry's: a test checks it)
FEATURE_READERS: dict[str, Callable[[DataConfig], FeatureSource]] = {
    "digits": lambda cfg: _digits(),
    "synthetic": _synthetic,
    "file": lambda cfg: _table(cfg.file.path, cfg.file.label_column),
}
