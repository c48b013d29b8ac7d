"""prepare: real, synthetic and file sources; exact seeded splits; the manifest catches missing and
corrupt files; a failed prepare leaves the data it found complete."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from scalelab.config import ConfigError, DataConfig, build
from scalelab.data import features, store
from scalelab.data import prepare as data
from scalelab.data import split as splitting


def test_digits_split_and_manifest(tmp_path):
    manifest = data.prepare(build(DataConfig, {}), tmp_path)
    sizes = {k: v["num_samples"] for k, v in manifest["splits"].items()}
    assert sizes == {"train": 1258, "val": 180, "test": 359} and manifest["input_shape"] == [1, 8, 8]
    assert manifest == store.verify(tmp_path) == store.verify(tmp_path, full=True)
    train = store.open_split(tmp_path, "train", manifest)
    x, y = train.fetch(np.array([3, 0, 1257]))
    assert len(train) == 1258 and x.shape == (3, 1, 8, 8) and x.dtype.is_floating_point and y.dtype.is_signed
    assert isinstance(train.arrays["x"], np.memmap)  # mapped, not loaded
    assert manifest["params"]["source"] == "digits" and manifest["kind"] == "features"
    from sklearn.datasets import load_digits  # every sample once, in one split, with its label

    splits = ("train", "val", "test")
    got = np.concatenate([np.load(tmp_path / f"{s}.x.npy") for s in splits]).reshape(-1, 64)
    labels = np.concatenate([np.load(tmp_path / f"{s}.y.npy") for s in splits])
    digits = load_digits()
    want = (digits.images.reshape(-1, 64) / 16).astype(np.float32)
    pairs = lambda xs, ys: sorted(bytes(x) + int(y).to_bytes(1, "little") for x, y in zip(xs, ys))  # noqa: E731
    assert pairs(got, labels) == pairs(want, digits.target)


@pytest.mark.integration  # a fresh interpreter: this one may have imported scikit-learn already
def test_digits_are_read_from_scikit_learns_file_without_importing_it():
    from sklearn.datasets import load_digits

    images, target = features.digits_arrays()
    digits = load_digits()
    assert np.array_equal(images, digits.images) and np.array_equal(target, digits.target)
    code = "import sys; from scalelab.data.features import digits_arrays; digits_arrays(); print(sorted(sys.modules))"
    modules = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "'sklearn'" not in modules and "'scalelab.data.features'" in modules


def test_split_sizes_are_exact_and_the_labels_seeded_and_independent_of_chunking():
    sizes = splitting.split_sizes(200_003, 0.1, 0.2)
    assert sizes == {"train": 140_002, "val": 20_000, "test": 40_001}
    whole = splitting.Splitter(sizes, seed=3).take(200_003)
    chunked = splitting.Splitter(sizes, seed=3)
    pieces = np.concatenate([chunked.take(k) for k in (1, 99_999, 70_000, 30_003)])
    assert np.array_equal(whole, pieces)
    assert np.bincount(whole).tolist() == [140_002, 20_000, 40_001]
    other = splitting.Splitter(sizes, seed=4).take(200_003)
    assert not np.array_equal(whole, other)
    assert abs(np.mean(whole[:100_000] == splitting.TEST) - 0.2) < 0.01  # spread, not bunched


def test_synthetic_is_seeded(tmp_path):
    cfg = build(DataConfig, {"source": "synthetic", "synthetic": {"num_samples": 200, "num_features": 5}})
    m1 = data.prepare(cfg, tmp_path / "a")
    m2 = data.prepare(cfg, tmp_path / "b")
    assert m1["splits"] == m2["splits"] and m1["input_shape"] == [5]
    m3 = data.prepare(build(DataConfig, {**data.to_dict(cfg), "seed": 1}), tmp_path / "c")
    assert m3["splits"]["train"]["arrays"]["x"]["sha256"] != m1["splits"]["train"]["arrays"]["x"]["sha256"]


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_user_table_with_named_label(tmp_path, suffix):
    frame = pd.DataFrame({"f1": range(50), "f2": [i * 0.5 for i in range(50)], "kind": ["b", "a"] * 25})
    path = tmp_path / f"in.{suffix}"
    frame.to_csv(path, index=False) if suffix == "csv" else frame.to_parquet(path)
    cfg = build(DataConfig, {"source": "file", "file": {"path": str(path), "label_column": "kind"}})
    manifest = data.prepare(cfg, tmp_path / "out")
    assert manifest["num_classes"] == 2 and manifest["input_shape"] == [2]
    rows = {}
    for s in ("train", "val", "test"):
        x, y = np.load(tmp_path / f"out/{s}.x.npy"), np.load(tmp_path / f"out/{s}.y.npy")
        rows.update({int(f1): int(code) for (f1, _), code in zip(x, y)})
    assert rows == {i: 1 if i % 2 == 0 else 0 for i in range(50)}  # "a" -> 0, "b" -> 1: sorted classes


def test_user_file_errors(tmp_path):
    pd.DataFrame({"f": [1, 2], "y": [0, 1]}).to_csv(tmp_path / "in.csv", index=False)
    with pytest.raises(ConfigError, match="label_column = 'label' is not a column"):
        data.prepare(build(DataConfig, {"source": "file", "file": {"path": str(tmp_path / "in.csv")}}), tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        data.prepare(build(DataConfig, {"source": "file", "file": {"path": "nope.csv"}}), tmp_path)


def test_missing_and_corrupt_files_are_named(tmp_path):
    data.prepare(build(DataConfig, {}), tmp_path)
    val = tmp_path / "val.x.npy"
    blob = bytearray(val.read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # a small file is hashed whole at start-up: any byte counts
    val.write_bytes(bytes(blob))
    with pytest.raises(store.DataError, match=r"val.x.npy is corrupt: its sha256.*dvc repro prepare"):
        store.verify(tmp_path)
    val.write_bytes(bytes(blob[:-10]))
    with pytest.raises(store.DataError, match=r"val.x.npy is corrupt: \d+ bytes, the manifest says"):
        store.verify(tmp_path)
    val.unlink()
    with pytest.raises(store.DataError, match=r"val.x.npy is missing.*dvc repro prepare"):
        store.verify(tmp_path)
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(store.DataError, match=r"manifest.json is missing"):
        store.verify(tmp_path)


def test_the_old_format_is_refused_with_the_rebuild_command(tmp_path):
    old = {"splits": {s: {"file": f"{s}.pt", "sha256": "0" * 64, "num_samples": 1} for s in ("train", "val", "test")}}
    (tmp_path / "manifest.json").write_text(json.dumps(old))
    with pytest.raises(store.DataError, match=r"older format.*dvc repro prepare"):
        store.verify(tmp_path)


def test_a_failed_prepare_leaves_the_data_it_found_complete(tmp_path, monkeypatch):
    """A prepare that dies half-way touches nothing: the earlier data and manifest stay, complete."""
    before = data.prepare(build(DataConfig, {}), tmp_path)
    (tmp_path / "train.pt").write_bytes(b"an earlier layout")  # cleared by the next good prepare
    calls = []
    real = data.NpyWriter.close

    def boom(self):
        calls.append(self.path.name)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(self)

    monkeypatch.setattr(data.NpyWriter, "close", boom)
    with pytest.raises(OSError, match="disk full"):
        data.prepare(build(DataConfig, {"seed": 1}), tmp_path)
    assert store.verify(tmp_path, full=True) == before
    assert not list(tmp_path.glob(f"{data.STAGING}*")), "the staging folder was left behind"
    monkeypatch.undo()
    data.prepare(build(DataConfig, {"seed": 1}), tmp_path)
    assert not (tmp_path / "train.pt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["manifest.json"] + [f"{s}.{a}.npy" for s in ("train", "val", "test") for a in ("x", "y")]
    )
