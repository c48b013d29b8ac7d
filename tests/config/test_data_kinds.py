"""A workload says what data it consumes (features, tokens); params validation refuses a pair that
does not fit, with one line naming both keys, before prepare or train starts anything."""

import pytest

from helpers import run_cli, tiny_params, write_params
from scalelab.config import ConfigError, parse_params
from scalelab.config.registry import consumes

GPT = {"vocab_size": 256, "seq_len": 16, "d_model": 16, "layers": 1, "heads": 2}
TEXT = {"source": "text", "text": {"path": "data/raw"}}


def test_each_workload_declares_its_data():
    assert {name: consumes(name, "train") for name in ("mlp", "cnn", "gpt")} == {
        "mlp": "features",
        "cnn": "features",
        "gpt": "tokens",
    }


@pytest.mark.parametrize(
    "data, train, needles",
    [
        ({}, {"workload": "gpt", "model": GPT}, ["train.workload = 'gpt' consumes tokens", "'digits' gives features"]),
        (TEXT, {"workload": "mlp"}, ["train.workload = 'mlp' consumes features", "'text' gives tokens", "gpt"]),
        ({"source": "file", "file": {"path": "x.csv"}}, {"workload": "gpt", "model": GPT}, ["cnn, mlp"]),
        (TEXT, {"workload": "gpt", "model": {**GPT, "vocab_size": 64}}, ["train.model.vocab_size = 64", "256"]),
    ],
)
def test_a_workload_and_data_that_do_not_fit_are_refused_in_one_line(data, train, needles):
    with pytest.raises(ConfigError) as err:
        parse_params(tiny_params(data=data, train=train), "params.yaml")
    line = str(err.value)
    assert "\n" not in line and line.startswith("params.yaml: ")
    assert all(n in line for n in needles), line


def test_the_pairs_that_fit_are_accepted():
    assert parse_params(tiny_params(data=TEXT, train={"workload": "gpt", "model": GPT}), "p").train.workload == "gpt"
    assert parse_params(tiny_params(train={"workload": "cnn", "model": {}}), "p").data.kind == "features"


@pytest.mark.integration
def test_prepare_refuses_the_pair_with_exit_2_and_writes_nothing(workdir):
    write_params(workdir / "params.yaml", tiny_params(train={"workload": "gpt", "model": GPT}))
    proc = run_cli("prepare", "--out", "data/prepared", cwd=workdir, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("scalelab prepare: error: params.yaml: train.workload = 'gpt' consumes tokens"), line
    assert not (workdir / "data").exists()


def test_prepared_data_of_the_other_kind_is_refused_before_training(tmp_path, prepared_digits):
    """Params that fit (gpt on text) but a data folder prepared from other params (digits)."""
    from scalelab.data.store import DataError
    from scalelab.training.submit import plan_job

    params = parse_params(tiny_params(data=TEXT, train={"workload": "gpt", "model": GPT}), "params.yaml")
    with pytest.raises(DataError, match=r"holds features \(data.source 'digits'\).*consumes tokens.*dvc repro prepare"):
        plan_job(params, prepared_digits)
