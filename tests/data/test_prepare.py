"""prepare: real, synthetic and file sources; the manifest catches missing and corrupt files."""

import json

import pandas as pd
import pytest
import torch

from scalelab.config import ConfigError, DataConfig, build
from scalelab.data import prepare as data
from scalelab.data import store


def test_digits_split_and_manifest(tmp_path):
    manifest = data.prepare(build(DataConfig, {}), tmp_path)
    sizes = {k: v["num_samples"] for k, v in manifest["splits"].items()}
    assert sum(sizes.values()) == 1797 and manifest["input_shape"] == [1, 8, 8]
    assert manifest == store.verify(tmp_path)
    x, y = store.load_split(tmp_path, "train")
    assert x.shape == (sizes["train"], 1, 8, 8) and y.dtype == torch.int64
    assert manifest["params"]["source"] == "digits"


def test_split_is_seeded_and_disjoint():
    a, b = data.split(100, 0.1, 0.2, seed=3), data.split(100, 0.1, 0.2, seed=3)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["train"], data.split(100, 0.1, 0.2, seed=4)["train"])
    assert len(set(torch.cat(list(a.values())).tolist())) == 100


def test_synthetic_is_seeded(tmp_path):
    cfg = build(DataConfig, {"source": "synthetic", "synthetic": {"num_samples": 200, "num_features": 5}})
    m1 = data.prepare(cfg, tmp_path / "a")
    m2 = data.prepare(cfg, tmp_path / "b")
    assert m1["splits"] == m2["splits"] and m1["input_shape"] == [5]


def test_user_csv_with_named_label(tmp_path):
    frame = pd.DataFrame({"f1": range(50), "f2": [i * 0.5 for i in range(50)],
                          "kind": ["a", "b"] * 25})
    frame.to_csv(tmp_path / "in.csv", index=False)
    cfg = build(DataConfig, {"source": "file", "file": {"path": str(tmp_path / "in.csv"),
                                                         "label_column": "kind"}})
    manifest = data.prepare(cfg, tmp_path / "out")
    assert manifest["num_classes"] == 2 and manifest["input_shape"] == [2]


def test_user_file_errors(tmp_path):
    pd.DataFrame({"f": [1, 2], "y": [0, 1]}).to_csv(tmp_path / "in.csv", index=False)
    with pytest.raises(ConfigError, match="label_column = 'label' is not a column"):
        data.prepare(build(DataConfig, {"source": "file", "file": {"path": str(tmp_path / "in.csv")}}), tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        data.prepare(build(DataConfig, {"source": "file", "file": {"path": "nope.csv"}}), tmp_path)


def test_missing_and_corrupt_files_are_named(tmp_path):
    data.prepare(build(DataConfig, {}), tmp_path)
    (tmp_path / "val.pt").write_bytes((tmp_path / "val.pt").read_bytes()[:-10] + b"0" * 10)
    with pytest.raises(store.DataError, match=r"val.pt is corrupt.*dvc repro prepare"):
        store.verify(tmp_path)
    (tmp_path / "val.pt").unlink()
    with pytest.raises(store.DataError, match=r"val.pt is missing.*dvc repro prepare"):
        store.verify(tmp_path)
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(store.DataError, match=r"manifest.json is missing"):
        store.verify(tmp_path)


def test_manifest_written_last(tmp_path, monkeypatch):
    """A prepare that dies half-way leaves no manifest, so nothing takes the data as complete."""
    data.prepare(build(DataConfig, {}), tmp_path)
    calls = []

    def boom(path, payload):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(path, payload)

    real = data.atomic_write_bytes
    monkeypatch.setattr(data, "atomic_write_bytes", boom)
    with pytest.raises(OSError):
        data.prepare(build(DataConfig, {"seed": 1}), tmp_path)
    assert not (tmp_path / "manifest.json").exists()
    assert json.loads(json.dumps(calls[0].name)) == "test.pt"
