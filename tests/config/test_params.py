"""params.yaml validation: every bad value names its key, the value and what is allowed."""

import pytest

from helpers import REPO, tiny_params, write_params
from scalelab.config import ConfigError, load_params


def load(tmp_path, **sections):
    return load_params(write_params(tmp_path / "params.yaml", tiny_params(**sections)))


def test_repo_params_are_valid():
    params = load_params(REPO / "params.yaml")
    assert params.train.strategy == "ddp" and params.train.nproc_per_node == 2


@pytest.mark.parametrize(
    "sections, needles",
    [
        ({"train": {"lrate": 0.1}}, ["train.lrate", "not a known key", "lr"]),
        ({"bogus": {}}, ["bogus", "not a known key", "train"]),
        ({"train": {"epochs": "ten"}}, ["train.epochs", "'ten'", "integer"]),
        ({"train": {"lr": -0.1}}, ["train.lr", "-0.1", "> 0"]),
        ({"train": {"batch_size": 0}}, ["train.batch_size", "0", ">= 1"]),
        ({"train": {"precision": "fp8"}}, ["train.precision", "'fp8'", "'bf16'"]),
        ({"train": {"workload": "resnet9000"}}, ["train.workload", "resnet9000", "mlp", "cnn"]),
        ({"train": {"workload": "gpt", "model": {}}}, ["train.workload", "'gpt'", "consumes tokens", "cnn, mlp"]),
        ({"speedup": {"workload": "gpt", "model": {"d_model": 30, "heads": 4}}}, ["speedup.model.d_model", "heads"]),
        ({"train": {"model": {"hidden": [32], "widht": 3}}}, ["train.model.widht", "hidden"]),
        ({"train": {"model": {"hidden": []}}}, ["train.model.hidden", "[]"]),
        ({"train": {"keep_checkpoints": 1}}, ["train.keep_checkpoints", ">= 2"]),
        ({"data": {"source": "file"}}, ["data.file.path", "file"]),
        ({"train": {"strategy": "single", "nproc_per_node": 2}}, ["train.nproc_per_node", "single"]),
    ],
)
def test_bad_values_name_key_value_and_fix(tmp_path, sections, needles):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, **sections)
    message = str(err.value)
    assert "\n" not in message
    assert "params.yaml" in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_bool_is_not_an_integer(tmp_path):
    with pytest.raises(ConfigError, match="train.epochs = True"):
        load(tmp_path, train={"epochs": True})


def test_malformed_yaml_names_the_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="params.yaml is not valid YAML"):
        load_params(path)
