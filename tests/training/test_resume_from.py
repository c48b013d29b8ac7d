"""`train.resume_from`: a job goes on from checkpoints made with other params or code, on purpose,
and its run says so. A bad value is refused, naming the key, the value and what is allowed, before
anything starts."""

import json

import pytest
import torch
from mlflow import MlflowClient
from test_resume import StopAtCheck

from helpers import REPO, histories, tiny_params, train_here, write_params
from scalelab.config import ConfigError, load_params, parse_params
from scalelab.tracking import tracking_uri
from scalelab.training.submit import plan_job

SINGLE = {"strategy": "single", "nproc_per_node": 1, "checkpoint_every_steps": 10}


@pytest.mark.integration  # three training runs in this process, into a real MLflow store
def test_resume_from_a_stale_set_goes_on_from_its_step_with_changed_params_and_tags_the_run(
    workdir, store_ready, prepared_digits
):
    out = workdir / "out"
    quiet = {"system_metrics_interval_s": 0}
    write_params(workdir / "a.yaml", tiny_params(train=SINGLE, tracking=quiet, slurm={"stop_check_every_steps": 1}))
    assert train_here(load_params(workdir / "a.yaml"), prepared_digits, out, stop=StopAtCheck(30))["step"] == 30
    old = json.loads((out / "checkpoints/job.json").read_text())["fingerprint"]
    # a params edit: the job refuses to resume, moves the checkpoints aside, and trains anew
    write_params(workdir / "b.yaml", tiny_params(train={**SINGLE, "lr": 0.001}, tracking=quiet))
    fresh = train_here(load_params(workdir / "b.yaml"), prepared_digits, out)
    assert min(s for s, _ in histories(fresh["run_id"])["train_loss"]) == 5  # from step 0
    stale = out / "checkpoints" / f"stale-{old}"
    assert (stale / "step-00000030.pt").is_file()
    # the same edit, told to go on from the stale set
    resume = {**SINGLE, "lr": 0.001, "resume_from": f"out/checkpoints/stale-{old}"}
    write_params(workdir / "c.yaml", tiny_params(train=resume, tracking=quiet, slurm={"stop_check_every_steps": 1}))
    first = train_here(load_params(workdir / "c.yaml"), prepared_digits, out, stop=StopAtCheck(10))
    run = MlflowClient(tracking_uri()).get_run(first["run_id"])
    assert first["step"] == 40 and first["run_id"] != fresh["run_id"]  # steps 31..40, in a new run
    assert run.data.tags["scalelab.resumed_from"] == str(stale)
    assert run.data.tags["scalelab.resumed_from_fingerprint"] == old
    assert run.data.tags["scalelab.resumed_from_step"] == "30"
    # preempted, it resumes from its own newest checkpoint, into its own run, not from the stale set
    got = train_here(load_params(workdir / "c.yaml"), prepared_digits, out)
    assert got["step"] == got["total_steps"] and got["run_id"] == first["run_id"]
    assert MlflowClient(tracking_uri()).get_run(got["run_id"]).data.tags["scalelab.resumed_from_step"] == "40"
    assert min(s for s, _ in histories(got["run_id"])["train_loss"]) == 35  # went on after step 30
    assert (stale / "step-00000030.pt").is_file()  # still there, beside the set moved aside now


def test_train_resume_from_of_a_bad_form_is_refused_naming_key_value_and_allowed(tmp_path):
    for bad in ("results/train/checkpoints/stale-*", "results/train/checkpoints/step-00000010.pt"):
        with pytest.raises(ConfigError) as err:
            parse_params(tiny_params(train={"resume_from": bad}), "params.yaml")
        assert f"train.resume_from = {bad!r} is not allowed: give '' (off) or the folder" in str(err.value)
    assert load_params(REPO / "params.yaml").train.resume_from == ""  # off in the checked-in params


@pytest.mark.parametrize(
    "value, problem",
    [
        ("nowhere", "does not exist"),
        ("empty", "holds no checkpoint"),
        ("out/checkpoints", "is this job's own checkpoint folder"),
    ],
)
def test_train_resume_from_without_a_checkpoint_is_refused_before_anything_starts(
    workdir, prepared_digits, value, problem
):
    (workdir / "empty").mkdir()
    (workdir / "out/checkpoints/stale-abc").mkdir(parents=True)
    torch.save({"step": 1}, workdir / "out/checkpoints/step-00000001.pt")
    params = parse_params(tiny_params(train={**SINGLE, "resume_from": value}), "p.yaml")
    with pytest.raises(ConfigError) as err:
        plan_job(params, prepared_digits, workdir / "out")
    message = str(err.value)
    assert message.startswith(f"train.resume_from = {value!r} is not allowed: ") and problem in message, message
    assert f"{workdir / 'out/checkpoints/stale-abc'}" in message  # the sets that could be given


def test_a_train_resume_from_folder_that_does_not_exist_stops_the_pipeline_at_validate(workdir, capsys):
    from scalelab.cli import main

    write_params(workdir / "params.yaml", tiny_params(train={"resume_from": "results/train/checkpoints/stale-abc"}))
    # the validate stage runs before DVC removes the train stage's outputs: a bad value costs no result
    assert main(["validate", "--params", str(workdir / "params.yaml"), "--out", str(workdir / "v.json")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "train.resume_from = 'results/train/checkpoints/stale-abc' is not allowed: " in line, line
    assert f"{workdir / 'results/train/checkpoints/stale-abc'} does not exist" in line, line
    assert not (workdir / "v.json").exists()
