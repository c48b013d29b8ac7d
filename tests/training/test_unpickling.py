"""No unpickling of data files: checkpoints and model.pt load as tensors and plain values only."""

import os
import random

import numpy as np
import pytest
import torch

from helpers import run_cli, tiny_params, write_params
from scalelab.runtime import seeds
from scalelab.training.checkpoint import Checkpointer, CheckpointError

MARKER = "/tmp/scalelab-pwned-marker"


class Payload:
    def __reduce__(self):
        return (open, (MARKER, "w"))  # would create the marker file if it were ever unpickled


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    seeds.seed_all(3)
    ckpt = Checkpointer(tmp_path, "fp")
    ckpt.save(1, {"rng": [seeds.rng_state()]})
    expected = (torch.rand(3), random.random(), np.random.rand())
    seeds.seed_all(99)
    seeds.set_rng_state(ckpt.load_latest()["rng"][0])  # loaded with weights_only=True
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]


@pytest.mark.integration  # runs `scalelab evaluate` in a subprocess
def test_a_model_file_with_a_pickled_payload_is_refused_and_never_runs(workdir, prepared_digits, tmp_path):
    if os.path.exists(MARKER):
        os.remove(MARKER)
    write_params(workdir / "params.yaml", tiny_params(tracking={"enabled": False}))
    (workdir / "train").mkdir()
    torch.save({"model": {}, "workload": Payload()}, workdir / "train/model.pt")
    (workdir / "train/run.json").write_text("{}")
    proc = run_cli(
        "evaluate", "--data", str(prepared_digits), "--train", "train", "--out", "eval.json", cwd=workdir, check=False
    )
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "model.pt holds pickled objects, not only weights; refused" in line and "Traceback" not in proc.stderr
    assert not os.path.exists(MARKER)  # the payload never ran


def test_a_checkpoint_with_a_pickled_payload_stops_the_load_and_never_runs(tmp_path):
    # not damage: an intact file that weights_only refuses stops the job with its cause (issue 28,
    # fault 3), rather than a silent fall-back to an older checkpoint
    ckpt = Checkpointer(tmp_path, "fp")
    ckpt.save(1, {"w": torch.ones(2)})
    torch.save({"step": 2, "fingerprint": "fp", "x": Payload()}, ckpt.path(2))
    with pytest.raises(CheckpointError, match="intact but cannot be loaded: .*Unsupported global"):
        ckpt.load_latest()
    assert not os.path.exists(MARKER)
