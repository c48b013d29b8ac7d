"""Every `-S` of `scalelab sweep submit` applies or is refused: `sweep.*` and `slurm.*` keys set the
submission itself (one value), the rest span the grid or the search space; a submission that SLURM
refuses exits 2 with one line, ends its parent run FAILED and frees the name. (`-S sweep.launcher=local`
running a grid here, over params that say slurm: tests/training/test_search.py's local grid.)"""

import os

import pytest
from mlflow import MlflowClient

from helpers import BIN, run_cli, tiny_params, write_params
from scalelab.config import ConfigError
from scalelab.sweeps import sweep


def test_a_setting_applies_to_the_submission_and_is_no_dimension(workdir):
    write_params(workdir / "params.yaml", tiny_params())
    raw, specs = sweep.settings("params.yaml", ["sweep.launcher=local", "train.lr=0.001,0.002", "slurm.max_timeouts=1"])
    assert (raw["sweep"]["launcher"], raw["slurm"]["max_timeouts"], specs) == ("local", 1, ["train.lr=0.001,0.002"])
    with pytest.raises(ConfigError, match="sweep.launcher is a setting of the submission.*give one value"):
        sweep.settings("params.yaml", ["sweep.launcher=local,slurm", "train.lr=0.001,0.002"])
    with pytest.raises(ConfigError, match="sweep.launcher"):  # the schema's own check, naming the key
        sweep.settings("params.yaml", ["sweep.launcher=pbs", "train.lr=0.001,0.002"])


@pytest.mark.integration
def test_a_refused_submission_exits_2_in_one_line_fails_its_parent_run_and_frees_the_name(workdir, prepared_digits):
    (workdir / "slurm").symlink_to(BIN.parents[1] / "slurm")  # the cluster profiles
    write_params(workdir / "params.yaml", tiny_params(train={"launcher": "slurm"}, sweep={"launcher": "slurm"}))
    # no SLURM here: no sbatch on PATH (a developer's machine), or none configured (CI's cluster
    # is configured through SLURM_CONF, pointed at an empty file here)
    (workdir / "empty-slurm.conf").write_text("")  # sbatch would retry a missing file for 60 s
    env = {"SLURM_CONF": str(workdir / "empty-slurm.conf"), "PATH": f"{BIN}:{os.environ['PATH']}"}
    for method in ("grid", "tpe"):
        args = ["sweep", "submit", "--name", "s1", "--data", str(prepared_digits), "--method", method]
        args += ["--trials", "2"] if method == "tpe" else []
        proc = run_cli(*args, "-S", "train.lr=0.001,0.002", cwd=workdir, env=env, check=False, timeout=300)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("scalelab sweep: error:")]
        assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert "no SLURM configuration" in errors[0] or "not on PATH" in errors[0], errors  # (sbatch's own lines too)
        assert not (workdir / "results/sweeps/s1").exists()  # the name is free again
    if not (workdir / "mlflow.db").exists():
        return  # refused before any run was made (no SLURM client on this machine)
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    states = [(r.info.run_name, r.info.status) for r in runs]
    assert all(status == "FAILED" for _, status in states), states  # sbatch refused: no run left open
