"""Names are names: a path separator or '..' in a profile, workload, experiment or sweep name is
bad input naming the key, and sweep values never reach a shell: refused ones exit 2 before
anything runs, and one that validation accepts is carried as data, verbatim."""

from pathlib import Path

import pytest

from helpers import run_cli, tiny_params, write_params
from scalelab.config import ConfigError, load_params

BAD = ["../../tmp/x", "a/b", "..", "x..y", "/etc/passwd", "a b", ""]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("key", ["slurm.profile", "train.workload", "speedup.workload", "tracking.experiment"])
def test_a_name_that_is_a_path_is_refused_naming_the_key(tmp_path, key, value):
    section, field = key.split(".")
    write_params(tmp_path / "p.yaml", tiny_params(**{section: {field: value}}))
    with pytest.raises(ConfigError, match=rf"{key} = {value!r} is not allowed: a name"):
        load_params(tmp_path / "p.yaml")


@pytest.mark.integration  # the CLI, in a process of its own
@pytest.mark.parametrize("name", ["../x", "a/b"])
def test_a_sweep_name_that_is_a_path_is_refused(workdir, prepared_digits, name):
    write_params(workdir / "params.yaml", tiny_params())
    proc = run_cli("sweep", "status", "--name", name, cwd=workdir, check=False)
    assert proc.returncode == 2 and "--name" in proc.stderr.strip().splitlines()[-1], proc.stderr


@pytest.mark.integration  # the CLI, in a process of its own, once per value
def test_sweep_values_never_reach_a_shell(workdir, prepared_digits, tmp_path):
    marker = tmp_path / "pwned"
    write_params(workdir / "params.yaml", tiny_params())
    for spec in [
        f"train.workload=1; touch {marker}",
        f"slurm.profile=$(touch {marker})",
        f"tracking.experiment=`touch {marker}`",
        f"train.lr=1;touch {marker}",
    ]:
        proc = run_cli(
            "sweep", "submit", "--name", "s", "--data", str(prepared_digits), "-S", spec, cwd=workdir, check=False
        )
        assert proc.returncode == 2, (spec, proc.stderr)
        assert not marker.exists() and not Path(workdir / "results").exists()


def test_a_sweep_value_that_validation_accepts_is_carried_as_data(workdir, tmp_path):
    from scalelab.sweeps import sweep

    marker = tmp_path / "pwned"
    value = f"x;touch {marker} $(touch {marker}) `touch {marker}`"  # a free-text field: valid
    write_params(workdir / "params.yaml", tiny_params())
    raw, specs = sweep.settings("params.yaml", [f"data.file.label_column={value}", "train.lr=0.001,0.002"])
    _, elements = sweep.plan("params.yaml", raw, specs)
    assert [params.data.file.label_column for _, params in elements] == [value, value]
    assert [params.train.lr for _, params in elements] == [0.001, 0.002]
    assert not marker.exists()
