"""Bad user data is refused by `scalelab prepare`, exit 2, naming file, column and problem, with
nothing written; `data.file.standardize` fits z-scores on the training split."""

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import run_cli, tiny_params, write_params
from scalelab.config import DataConfig, build
from scalelab.data.prepare import prepare


def table(n=200, **overrides):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n) * 100 + 50, "label": np.arange(n) % 3})
    for column, values in overrides.items():
        frame[column] = values
    return frame


def nan_at(n, i, value=np.nan):
    col = np.ones(n)
    col[i] = value
    return col


CASES = {
    "nan feature": (lambda p: table(b=nan_at(200, 7)).to_csv(p, index=False), ["'b'", "NaN or inf", "row 8"]),
    "inf feature": (lambda p: table(a=nan_at(200, 3, np.inf)).to_csv(p, index=False), ["'a'", "inf"]),
    "nan label": (lambda p: table(label=[np.nan] + [1] * 199).to_csv(p, index=False), ["'label'", "empty"]),
    "single class": (lambda p: table(label=[4] * 200).to_csv(p, index=False), ["'label'", "single class"]),
    "empty file": (lambda p: p.write_text(""), ["cannot be read as a table"]),
    "header only": (lambda p: p.write_text("a,b,label\n"), ["header but no rows"]),
    "text feature": (lambda p: table(a=["x"] * 200).to_csv(p, index=False), ["'a'", "not numeric"]),
    "too few rows": (lambda p: table(n=60).to_csv(p, index=False), ["fewer than one global batch of 64"]),
}


@pytest.mark.integration  # `scalelab prepare`, in a process of its own
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_data_exits_2_before_anything_is_written(workdir, case):
    make, needles = CASES[case]
    (workdir / "data/raw").mkdir(parents=True)
    make(workdir / "data/raw/t.csv")
    write_params(workdir / "params.yaml", tiny_params(data={"source": "file", "file": {"path": "data/raw/t.csv"}}))
    proc = run_cli("prepare", "--out", "data/prepared", cwd=workdir, check=False)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("scalelab prepare: error: ") and "Traceback" not in proc.stderr
    assert "data/raw/t.csv" in line and all(n in line for n in needles), line
    assert not (workdir / "data/prepared").exists()


def test_standardize_uses_training_statistics_and_records_them(tmp_path):
    path = tmp_path / "t.csv"
    table().to_csv(path, index=False)
    cfg = build(DataConfig, {"source": "file", "file": {"path": str(path), "standardize": True}})
    manifest = prepare(cfg, tmp_path / "out")
    train = torch.from_numpy(np.load(tmp_path / "out/train.x.npy"))
    assert torch.allclose(train.mean(0), torch.zeros(2), atol=1e-5)
    assert torch.allclose(train.std(0), torch.ones(2), atol=1e-5)
    raw = torch.tensor(table()[["a", "b"]].to_numpy(), dtype=torch.float32)
    assert manifest["standardize"]["fitted_on"] == "train"
    assert manifest["standardize"]["mean"][1] == pytest.approx(raw[:, 1].mean().item(), rel=0.1)  # ~50
    test = torch.from_numpy(np.load(tmp_path / "out/test.x.npy"))
    assert not torch.allclose(test.mean(0), torch.zeros(2), atol=1e-5)  # test statistics were not used
