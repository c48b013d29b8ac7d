"""Data preparation: digits, synthetic, a CSV/Parquet table, a text or JSON Lines corpus -> data/prepared/.

Each split is a few `.npy` files (scalelab.data.arrays), written as the input streams past, so
prepare's memory does not grow with the data:
- features (digits, synthetic, file): `<split>.x.npy` (float32, one row per sample) and
  `<split>.y.npy` (int64 class codes);
- tokens (text, jsonl): `<split>.tokens.npy` (uint8 bytes) and `<split>.doc_starts.npy` (int64 offsets
  of its documents).
`manifest.json` comes last: the kind, the shapes, every file's sha256, md5 and probe digest, and
the params that produced them. Everything is written into a staging folder first and moved into
place at the end, so bad input (a ConfigError naming the file) leaves `out_dir` as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.config import ConfigError, DataConfig, to_dict
from scalelab.data import jsonl, text
from scalelab.data.arrays import NpyWriter, file_entry
from scalelab.data.features import feature_source
from scalelab.data.split import SPLITS, TRAIN, Splitter, split_sizes
from scalelab.data.store import FORMAT, MANIFEST
from scalelab.runtime.io import atomic_write_json

STAGING = ".staging-"
# each token source of config/names.py: its section of knobs -> its files and their documents as
# byte pieces (the same keys as the registry's token sources: a test checks it)
TOKEN_READERS = {"text": text.reader, "jsonl": jsonl.reader}


def prepare(
    cfg: DataConfig, out_dir: str | Path, *, min_train_samples: int = 1, seq_len: int | None = None
) -> dict[str, Any]:
    """Builds the splits and writes them with their manifest; returns the manifest.

    Args:
        cfg: params `data`.
        out_dir: data/prepared.
        min_train_samples: the training job's global batch; a smaller training split is refused
            here, before any training process starts.
        seq_len: tokens per sample of the token workload (a sample is seq_len + 1 tokens, inputs and
            shifted targets); the splits of a text corpus must hold that many samples.

    Raises:
        ConfigError: bad input, naming the file or key; `out_dir` is left as it was.
    """
    out = Path(out_dir)
    with _staging(out) as tmp:
        if cfg.kind == "tokens":
            body = _prepare_tokens(cfg, tmp, min_train_samples, seq_len or 1)
        else:
            body = _prepare_features(cfg, tmp, min_train_samples)
        manifest = {"format": FORMAT, "source": cfg.source, **body, "params": to_dict(cfg)}
        _commit(out, tmp, manifest)
    return manifest


@contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A staging folder inside `out`; on failure it goes, and so does `out` if made here."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{STAGING}*"):  # left by a killed prepare
        shutil.rmtree(old, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=STAGING, dir=out))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if made:
            shutil.rmtree(out, ignore_errors=True)
        raise


def _commit(out: Path, tmp: Path, manifest: dict[str, Any]) -> None:
    """Moves the staged files into place; the manifest, written last, marks the data complete."""
    (out / MANIFEST).unlink(missing_ok=True)  # no manifest until every file is in place
    for old in out.iterdir():  # an earlier prepare's arrays (or the old .pt layout)
        if old.is_file() and old.suffix in (".npy", ".pt"):
            old.unlink()
    for path in tmp.iterdir():
        os.replace(path, out / path.name)
    tmp.rmdir()
    atomic_write_json(out / MANIFEST, manifest)


def _refuse_small_train(cfg: DataConfig, have: int, need: int, what: str) -> None:
    if have < need:
        source = getattr(cfg.section, "path", None) or f"data.source {cfg.source!r}"
        raise ConfigError(
            f"{source}: the training split has {have} {what}, fewer than one global batch of {need} "
            "(train.batch_size x grad_accum_steps x processes); add data or lower train.batch_size"
        )


def _prepare_features(cfg: DataConfig, tmp: Path, min_train_samples: int) -> dict[str, Any]:
    src = feature_source(cfg)
    sizes = split_sizes(src.num_rows, cfg.val_fraction, cfg.test_fraction)
    _refuse_small_train(cfg, sizes["train"], min_train_samples, "samples")
    splitter = Splitter(sizes, cfg.seed)
    xs = {n: NpyWriter(tmp / f"{n}.x.npy", np.float32, src.row_shape) for n in SPLITS}
    ys = {n: NpyWriter(tmp / f"{n}.y.npy", np.int64) for n in SPLITS}
    fit = cfg.source == "file" and cfg.file.standardize  # z-scores fitted on the training split only
    moments = np.zeros((3, int(np.prod(src.row_shape))))  # train: count, sum, sum of squares (float64)
    for x, y in src.chunks():
        labels = splitter.take(len(y))
        for i, name in enumerate(SPLITS):
            xs[name].append(x[labels == i])
            ys[name].append(y[labels == i])
        if fit:
            train = x[labels == TRAIN].reshape(-1, moments.shape[1]).astype(np.float64)
            moments += [np.full(moments.shape[1], len(train)), train.sum(0), np.square(train).sum(0)]
    for writer in [*xs.values(), *ys.values()]:
        writer.close()
    scaling = _standardize(tmp, moments) if fit else None
    splits = {
        n: {"num_samples": ys[n].rows, "arrays": {"x": file_entry(xs[n].path), "y": file_entry(ys[n].path)}}
        for n in SPLITS
    }
    return {
        "kind": "features",
        "input_shape": list(src.row_shape),
        "num_classes": src.num_classes,
        "splits": splits,
        "standardize": scaling,
    }


def _standardize(tmp: Path, moments: np.ndarray) -> dict[str, Any]:
    """z-scores every split's features in place, with the training split's mean and std (ddof 1)."""
    count, total, squares = moments
    mean = total / count
    std = np.sqrt(np.maximum(squares - count * mean**2, 0.0) / np.maximum(count - 1, 1))
    std = np.where(std > 0, std, 1.0)
    for name in SPLITS:
        x = np.load(tmp / f"{name}.x.npy", mmap_mode="r+")
        for start in range(0, len(x), 1 << 16):
            block = x[start : start + (1 << 16)]
            block[:] = ((block - mean) / std).astype(np.float32)
        x.flush()
        del x
    return {"mean": mean.tolist(), "std": std.tolist(), "fitted_on": "train"}


def _prepare_tokens(cfg: DataConfig, tmp: Path, min_train_samples: int, seq_len: int) -> dict[str, Any]:
    t, key = cfg.section, f"data.{cfg.source}"
    files, pieces = TOKEN_READERS[cfg.source](t)
    corpus = text.scan(files, pieces)
    if corpus.num_documents < len(SPLITS):
        more = "data.text.separator" if cfg.source == "text" else "more lines"
        raise ConfigError(
            f"{key}.path = {t.path!r} gives {corpus.num_documents} document(s) (UTF-8, not empty): train, val "
            f"and test are split by document and need at least 3; give a folder of files, or set {more}"
        )
    sizes = split_sizes(corpus.num_documents, cfg.val_fraction, cfg.test_fraction)
    streams = text.SplitStreams(tmp, SPLITS)
    text.write_split_streams(corpus, pieces, Splitter(sizes, cfg.seed), streams)
    for writer in streams.writers():
        writer.close()
    tokens = {n: streams.tokens[n].rows for n in SPLITS}
    _refuse_small_train(cfg, (tokens["train"] - 1) // seq_len, min_train_samples, f"sequences of {seq_len} tokens")
    for name in ("val", "test"):
        if (tokens[name] - 1) // seq_len < 1:
            raise ConfigError(
                f"{key}.path = {t.path!r}: the {name} split holds {tokens[name]} tokens, fewer than one sequence "
                f"of {seq_len} + 1 (train.model.seq_len); add documents or raise data.{name}_fraction"
            )
    splits = {
        n: {
            "num_tokens": tokens[n],
            "num_documents": streams.starts[n].rows,
            "num_bytes": tokens[n],  # byte tokens: one byte each
            "arrays": {"tokens": file_entry(streams.tokens[n].path), "doc_starts": file_entry(streams.starts[n].path)},
        }
        for n in SPLITS
    }
    return {
        "kind": "tokens",
        "tokenizer": t.tokenizer,
        "vocab_size": text.VOCAB_SIZES[t.tokenizer],
        "input_shape": [],  # a sample's length is the model's seq_len
        "num_classes": text.VOCAB_SIZES[t.tokenizer],  # next-token prediction: one class per token
        "splits": splits,
        "skipped": corpus.skipped,
    }
