"""Bad input through the real `scalelab train`: exit 2, one clear line, nothing started.

"Nothing started" is checked by what a started job leaves behind: no mlflow.db (no MLflow run),
no checkpoints folder (no rank ran), and no torchrun output.
"""

import pytest

from helpers import run_cli, tiny_params, write_params

pytestmark = pytest.mark.integration


def attempt(workdir, data_dir, **sections):
    write_params(workdir / "params.yaml", tiny_params(**sections))
    proc = run_cli("train", "--data", str(data_dir), "--out", "out", cwd=workdir, check=False)
    assert proc.returncode == 2, proc.stderr
    assert not (workdir / "mlflow.db").exists(), "an MLflow store was created"
    assert not (workdir / "out").exists(), "a training process started"
    assert "torch.distributed" not in proc.stderr and "Traceback" not in proc.stderr
    return proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "sections, needles",
    [
        ({"train": {"learning_rate": 0.1}}, ["train.learning_rate", "not a known key", "lr"]),
        ({"train": {"epochs": "3"}}, ["train.epochs", "'3'", "integer"]),
        ({"train": {"lr": -0.01}}, ["train.lr", "-0.01", "must be > 0"]),
        ({"train": {"batch_size": 0}}, ["train.batch_size", "= 0", "must be >= 1"]),
        (
            {"train": {"nproc_per_node": 512, "device": "cpu"}},
            ["train.nproc_per_node", "512", "CPU cores", "use at most"],
        ),
        ({"train": {"workload": "transformerz"}}, ["train.workload", "transformerz", "mlp"]),
    ],
)
def test_bad_params(workdir, prepared_digits, sections, needles):
    line = attempt(workdir, prepared_digits, **sections)
    assert line.startswith("scalelab train: error: params.yaml: ")
    for needle in needles:
        assert needle in line, (needle, line)


def copy_prepared(src, dest):
    dest.mkdir()
    for path in src.iterdir():
        (dest / path.name).write_bytes(path.read_bytes())
    return dest


def test_missing_prepared_file(workdir, prepared_digits):
    data = copy_prepared(prepared_digits, workdir / "prepared")
    (data / "train.x.npy").unlink()
    line = attempt(workdir, data)
    assert "train.x.npy is missing" in line and "dvc repro prepare" in line


def test_corrupted_prepared_file(workdir, prepared_digits):
    data = copy_prepared(prepared_digits, workdir / "prepared")
    blob = bytearray((data / "train.x.npy").read_bytes())
    blob[len(blob) // 2] ^= 0xFF  # a file under 32 MiB is hashed whole at start-up (larger: probed)
    (data / "train.x.npy").write_bytes(bytes(blob))
    line = attempt(workdir, data)
    assert "train.x.npy is corrupt" in line and "sha256" in line and "dvc repro prepare" in line
