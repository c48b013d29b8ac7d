"""train.strategy fsdp (FSDP2, 2 gloo processes) through the real CLI and torchrun: the same math as
one process and as ddp, grad accumulation, resume after SIGKILL, full-state checkpoints.

`dvc repro` then `scalelab reproduce` of an FSDP run (preempted and resumed, too) is
tests/reproduce/test_reproduce_preempted.py."""

import json

import pytest
import torch
from mlflow import MlflowClient
from test_ddp import assert_same_weights, sigkill_after_first_checkpoint, train, weights

from helpers import histories, run_cli, tiny_params, write_params

pytestmark = pytest.mark.distributed

FSDP = {"strategy": "fsdp"}
# no dropout (its masks differ per rank), plain sgd: the math of one global batch, however it is split
EXACT = {"model": {"hidden": [32], "dropout": 0.0}, "optimizer": "sgd", "lr": 0.05}


EPOCHS = 6  # the resume test: the first checkpoint (step 20) comes mid-epoch, long before the end
TOTAL = EPOCHS * 19  # digits: 19 global batches of 64 per epoch


def assert_close_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.slow  # four training jobs
def test_fsdp_matches_one_process_and_ddp_and_accumulates_gradients(workdir, prepared_digits):
    # DistributedSampler deals one shuffled order round-robin: at every step the 2 ranks' batches of
    # B together are exactly the one process's batch of 2B, so the runs differ only in float rounding
    # (mean of two half-batch means vs one mean): within tolerance, not bitwise. fsdp and ddp do the
    # same reductions on the same values: bitwise equal.
    steps = {}

    def run(out, **train_section):
        folder = train(workdir, prepared_digits, out=out, tracking={"enabled": False}, train=train_section)
        steps[out] = json.loads((folder / "metrics.json").read_text())["steps"]
        return weights(folder)

    single = run("single", **EXACT, strategy="single", nproc_per_node=1, batch_size=64)
    fsdp = run("fsdp", **EXACT, **FSDP, batch_size=32)
    ddp = run("ddp", **EXACT, strategy="ddp", batch_size=32)
    acc = run("acc", **EXACT, **FSDP, batch_size=16, grad_accum_steps=2)  # strategy.no_sync's FSDP path

    assert set(steps.values()) == {38}, steps  # digits: 2 epochs x 19 global batches of 64
    assert_close_weights(fsdp, single)
    assert_same_weights(fsdp, ddp)
    assert_close_weights(acc, single)


@pytest.mark.slow  # three training jobs, one killed
def test_fsdp_sigkill_then_resume_matches_uninterrupted_run(workdir, prepared_digits):
    # the killed job saves asynchronously (DCP's async_save): what it committed while the next steps
    # ran is the state of its step, so the resumed run ends bitwise equal to the synchronous one
    sections = {"train": {**FSDP, "epochs": EPOCHS, "checkpoint_every_steps": 20}}
    ref = train(workdir, prepared_digits, out="ref", tracking={"enabled": False}, **sections)

    sections["train"]["async_checkpoint"] = True  # a cadence key: the same fingerprint
    ckpts, run_id_before = sigkill_after_first_checkpoint(workdir, prepared_digits, sections)

    resumed = max(int(p.stem.split("-")[1]) for p in ckpts.glob("step-*"))

    rerun = run_cli("train", "--data", str(prepared_digits), "--out", "killed", cwd=workdir)
    # from the checkpoint, not from scratch (which would give the same weights too)
    assert f"| {resumed}/{TOTAL} [" in rerun.stderr, rerun.stderr[-3000:]
    assert_same_weights(weights(ref), weights(workdir / "killed"))

    run_id = json.loads((workdir / "killed" / "run.json").read_text())["run_id"]
    assert run_id == run_id_before
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "FINISHED"
    assert client.get_run(run_id).data.tags["scalelab.strategy"] == "fsdp"
    steps = [m.step for m in client.get_metric_history(run_id, "train_loss")]
    assert steps == sorted(set(steps)), "duplicate or unordered metric steps after resume"
    assert steps == sorted(set(range(5, steps[-1], 5)) | {steps[-1]}), "gaps in the metric steps"
    runs = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
    assert len(runs) == 1


@pytest.mark.slow  # three training jobs, one killed
def test_an_fsdp_checkpoint_saved_at_2_ranks_resumes_at_1(workdir, prepared_digits):
    # the same global batch of 64 on one rank: DCP reshards on load, the data order goes on from the
    # step, so the result equals the uninterrupted 2-rank run up to float rounding (see above)
    two = {**FSDP, **EXACT, "epochs": EPOCHS, "checkpoint_every_steps": 20}
    ref = train(workdir, prepared_digits, out="ref", tracking={"enabled": False}, train=two)
    ckpts, run_id = sigkill_after_first_checkpoint(workdir, prepared_digits, {"train": two})
    resumed = max(int(p.stem.split("-")[1]) for p in ckpts.glob("step-*"))
    assert (ckpts / f"step-{resumed:08d}.dcp" / "__1_0.distcp").is_file()  # written by 2 ranks
    write_params(workdir / "params.yaml", tiny_params(train={**two, "nproc_per_node": 1, "batch_size": 64}))
    rerun = run_cli("train", "--data", str(prepared_digits), "--out", "killed", cwd=workdir)
    assert f"| {resumed}/{TOTAL} [" in rerun.stderr, rerun.stderr[-3000:]
    assert f"resuming step {resumed}, saved by 2 ranks, on 1" in rerun.stderr
    assert json.loads((workdir / "killed/run.json").read_text())["run_id"] == run_id
    assert_close_weights(weights(workdir / "killed"), weights(ref))


def test_fsdp_checkpoint_is_one_shard_file_per_rank_and_converts_to_the_full_state(workdir, prepared_digits):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from scalelab.training import workloads

    out = train(
        workdir,
        prepared_digits,
        out="ckpt",
        tracking={"enabled": False},
        train={**FSDP, "epochs": 1, "model": {"hidden": [512], "dropout": 0.1}, "optimizer": "sgd", "momentum": 0.9},
    )
    manifest = json.loads((prepared_digits / "manifest.json").read_text())
    plain = workloads.load(
        "mlp", {"hidden": [512]}, input_shape=manifest["input_shape"], num_classes=manifest["num_classes"]
    ).model.state_dict()
    assert plain["1.weight"].shape == (512, 64)  # 38k parameters: 300 KB with their momentum

    folders = sorted((out / "checkpoints").glob("step-*.dcp"))
    assert folders and not list((out / "checkpoints").glob("step-*.pt")), "no sharded checkpoint written"
    newest = folders[-1]
    assert {p.name for p in newest.iterdir()} == {
        ".metadata",
        "metadata.sha256",
        "sizes.json",
        "extra.pt",
        "__0_0.distcp",
        "__1_0.distcp",
    }
    # each rank wrote its own half of the weights and momentum buffers (and some framing), not the whole
    whole = 2 * sum(t.numel() * t.element_size() for t in plain.values())
    for shard in ("__0_0.distcp", "__1_0.distcp"):
        assert (newest / shard).stat().st_size < 0.75 * whole, shard

    dcp_to_torch_save(newest, workdir / "full.pt")  # torch's converter: the full state, offline
    full = torch.load(workdir / "full.pt", weights_only=True)
    model = full["model"]
    assert {k: tuple(v.shape) for k, v in model.items()} == {k: tuple(v.shape) for k, v in plain.items()}
    assert_same_weights(model, weights(out))  # the last checkpoint is the final step
    optim = full["optimizer"]
    assert set(optim["state"]) == set(plain), optim["state"].keys()  # the mlp has no buffers
    for name, entry in optim["state"].items():
        buf = entry["momentum_buffer"]
        assert buf.shape == plain[name].shape and buf.abs().sum() > 0, (name, buf.shape)


@pytest.mark.slow  # three training jobs
def test_clipped_gradient_norm_under_ddp_and_fsdp_equals_one_process(workdir, prepared_digits):
    # the norm each job logs (before clipping) is of the whole gradient: under fsdp each rank holds
    # shards and the partial norms are reduced. One process and two ranks differ in float rounding
    # only (see above), so the norms and the clipped weights agree within a relative 1e-4.
    clip = {**EXACT, "grad_clip_norm": 0.05, "lr_schedule": "cosine", "lr_warmup_steps": 5}
    logged, final = {}, {}
    for name, section in {
        "single": {"strategy": "single", "nproc_per_node": 1, "batch_size": 64},
        "ddp": {"strategy": "ddp", "batch_size": 32},
        "fsdp": {**FSDP, "batch_size": 32},
    }.items():
        out = train(workdir, prepared_digits, out=name, train={**clip, **section})
        run_id = json.loads((out / "run.json").read_text())["run_id"]
        logged[name] = histories(run_id, f"sqlite:///{workdir / 'mlflow.db'}")["grad_norm"]
        final[name] = weights(out)
    steps = [s for s, _ in logged["single"]]
    assert steps == sorted({*range(5, 39, 5), 38}) and min(n for _, n in logged["single"]) > 0.05  # clipped each time
    for name in ("ddp", "fsdp"):
        assert [s for s, _ in logged[name]] == steps
        for (_, want), (_, got) in zip(logged["single"], logged[name]):
            assert got == pytest.approx(want, rel=1e-4), name
        assert_close_weights(final[name], final["single"])


@pytest.mark.slow  # two training jobs
def test_fsdp_with_activation_checkpointing_trains_the_same_weights(workdir, prepared_digits):
    # each sharded unit also recomputes its forward in backward (gathering its shards again);
    # dropout's masks are replayed, so the job is the same computation
    section = {**FSDP, "epochs": 1, "model": {"hidden": [32, 32], "dropout": 0.1}}
    plain = weights(train(workdir, prepared_digits, out="plain", tracking={"enabled": False}, train=section))
    ac = train(
        workdir,
        prepared_digits,
        out="ac",
        tracking={"enabled": False},
        train={**section, "activation_checkpointing": True},
    )
    assert_close_weights(weights(ac), plain)
