"""Sampling text from a trained gpt: the same seed gives the same text, the model files load as the
README says (its loading example runs here), and a model that takes no tokens is refused."""

import re

import pytest
import torch

from helpers import REPO
from scalelab.cli import main
from scalelab.training import workloads
from scalelab.training.outputs import model_file
from scalelab.training.sampling import (
    generate,  # noqa: F401 (the README names the module)
    load_model,
    sample_text,
)

GPT = {"vocab_size": 256, "seq_len": 16, "d_model": 16, "layers": 1, "heads": 2}


class Params:  # what model_file reads of the params
    def __init__(self, workload, model):
        self.train = type("Train", (), {"workload": workload, "model": model})()


def write_model(path, workload="gpt", model=GPT, extra=None):
    torch.manual_seed(0)
    wl = workloads.load(workload, model, input_shape=[16], num_classes=10)
    manifest = {"input_shape": [16], "num_classes": 10}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model_file(Params(workload, model), wl.model.state_dict(), manifest, extra))
    return wl


def test_the_same_seed_gives_the_same_text_and_the_cli_prints_it(tmp_path, capsys):
    path = tmp_path / "best.pt"
    write_model(path, extra={"best": {"metric": "val_loss", "value": 1.0, "step": 3}})
    wl, info = load_model(path)
    assert info["best"]["step"] == 3 and not wl.model.training
    a, b, c = (sample_text(wl, "def ", 40, 0.8, seed) for seed in (0, 0, 1))
    assert a == b != c and a.startswith("def ") and len(a.encode("utf-8", "surrogateescape")) >= 4
    assert sample_text(wl, "x", 10, 0.0, 0) == sample_text(wl, "x", 10, 0.0, 5)  # temperature 0: greedy
    args = ["sample", "--checkpoint", str(path), "--prompt", "def ", "--tokens", "40", "--seed", "0"]
    assert main(args) == 0
    assert capsys.readouterr().out == a + "\n"


def test_a_model_that_takes_no_tokens_and_a_missing_file_are_refused_in_one_line(tmp_path, capsys):
    write_model(tmp_path / "model.pt", workload="mlp", model={"hidden": [8], "dropout": 0.0})
    assert main(["sample", "--checkpoint", str(tmp_path / "model.pt")]) == 2
    assert "does not take tokens" in capsys.readouterr().err
    assert main(["sample", "--checkpoint", str(tmp_path / "absent.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_readme_loading_example_runs(tmp_path, monkeypatch):
    readme = (REPO / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "load_model" in b]
    write_model(tmp_path / "results/train/best.pt", extra={"best": {"metric": "val_loss", "value": 1.0, "step": 3}})
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)  # the README's own code, as a reader runs it
    assert namespace["blob"]["workload"] == "gpt" and namespace["info"]["best"]["step"] == 3
    assert isinstance(namespace["wl"].model, torch.nn.Module)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampling_leaves_the_global_rng_and_the_models_mode_alone(tmp_path, temperature):
    wl = write_model(tmp_path / "m.pt")
    wl.model.train()
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    sample_text(wl, "ab", 8, temperature, 0)
    assert torch.equal(torch.rand(3), expected) and wl.model.training
