"""train.checkpoint_dir in the lab's store, through the real CLI, torchrun (2 gloo ranks) and a real
local S3 server (rclone serve s3): a job killed after its first checkpoint resumes from another
output folder with an empty local disk (fsdp resharded onto 1 rank, ddp bitwise); the store
unreachable at the start is one line, exit 2, before anything starts; the store stopped in the
middle of a job's checkpoint uploads is one line naming the store, and the rerun completes."""

import json
import os
import signal
import subprocess

import pytest
from test_ddp import assert_same_weights, train, weights
from test_fsdp import EXACT, FSDP, assert_close_weights

from helpers import BIN, output_tail, process_tree, run_cli, signal_all, tiny_params, wait_for, write_params
from scalelab.storage import filesystem
from services import s3, s3_server  # noqa: F401 (fixture)

pytestmark = pytest.mark.distributed

EPOCHS = 6
TOTAL = EPOCHS * 19  # digits: 19 global batches of 64 per epoch


def point_at(workdir, server, url="s3://scalelab/lab"):
    """Makes `server` this clone's store, as `scalelab store set` does (DVC's default remote)."""
    dvc = workdir / ".dvc"
    dvc.mkdir(exist_ok=True)
    (dvc / "config").write_text(
        f"[core]\n    remote = store\n['remote \"store\"']\n    url = {url}\n    endpointurl = {server.endpoint}\n"
    )
    (dvc / "config.local").write_text(
        f"['remote \"store\"']\n    access_key_id = {server.access_key_id}\n"
        f"    secret_access_key = {server.secret_access_key}\n"
    )
    return server.base_path / "data" / url.removeprefix("s3://")


def committed(folder):
    """The committed checkpoints under `folder` (the store's objects on the server's disk)."""
    return sorted(p.parent for p in folder.rglob("step-*.dcp/extra.pt")) + sorted(folder.rglob("step-*.pt"))


def start_job(workdir, prepared_digits, out):
    cmd = [str(BIN / "scalelab"), "train", "--data", str(prepared_digits), "--out", out]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    log = workdir / f"{out}.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, start_new_session=True, stdout=sink, stderr=sink)
    return proc, log


def kill_after_first_checkpoint(workdir, prepared_digits, sections, store_disk):
    """Starts `scalelab train --out killed`, SIGKILLs every process of the job once a checkpoint is
    committed in the store; returns the step of the newest committed one."""
    write_params(workdir / "params.yaml", tiny_params(**sections))
    proc, log = start_job(workdir, prepared_digits, "killed")
    wait_for(lambda: committed(store_disk), 180, "the first checkpoint in the store", proc, log=log, poll_s=0.02)
    job = process_tree(proc.pid)
    signal_all(job, signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not any(p.is_running() for p in job), 60, "the killed job's processes to exit", log=log)
    assert not (workdir / "killed/model.pt").exists(), f"the run finished before the kill{output_tail(log)}"
    assert os.listdir(workdir / "killed/checkpoints") == ["location.txt"], "checkpoints went to the local disk"
    return max(int(p.name.split("-")[1].split(".")[0]) for p in committed(store_disk))


@pytest.mark.slow  # three training jobs, one killed
def test_fsdp_checkpoints_in_the_store_resume_elsewhere_on_one_rank(workdir, prepared_digits, s3):
    store_disk = point_at(workdir, s3)
    two = {**FSDP, **EXACT, "epochs": EPOCHS, "checkpoint_every_steps": 20}
    ref = train(workdir, prepared_digits, out="ref", tracking={"enabled": False}, train=two)
    # saved asynchronously (DCP's async_save through its fsspec writer): a cadence key, the same fingerprint
    killed = {**two, "checkpoint_dir": "store", "async_checkpoint": True}
    resumed = kill_after_first_checkpoint(workdir, prepared_digits, {"train": killed}, store_disk)
    [folder] = {p.parent for p in committed(store_disk)}  # <store>/checkpoints/<fingerprint>
    assert folder.parent == store_disk / "checkpoints"
    assert (folder / f"step-{resumed:08d}.dcp" / "__1_0.distcp").is_file()  # written by 2 ranks
    run_id = json.loads((folder / "job.json").read_text())["run_id"]
    folder_url = f"s3://scalelab/lab/checkpoints/{folder.name}"
    # another output folder, nothing on its disk; one rank, the same global batch
    one = {**two, "checkpoint_dir": "store", "nproc_per_node": 1, "batch_size": 64}
    write_params(workdir / "params.yaml", tiny_params(train=one))
    rerun = run_cli("train", "--data", str(prepared_digits), "--out", "elsewhere", cwd=workdir)
    assert f"| {resumed}/{TOTAL} [" in rerun.stderr, rerun.stderr[-3000:]
    assert f"resuming step {resumed}, saved by 2 ranks, on 1" in rerun.stderr
    assert json.loads((workdir / "elsewhere/run.json").read_text())["run_id"] == run_id
    assert_close_weights(weights(workdir / "elsewhere"), weights(ref))
    assert (workdir / "elsewhere/best.pt").is_file()
    # DVC's output <out>/checkpoints only says where they are
    assert (workdir / "elsewhere/checkpoints/location.txt").read_text() == f"{folder_url}\n"
    assert os.listdir(workdir / "elsewhere/checkpoints") == ["location.txt"]


@pytest.mark.slow  # three training jobs, one killed
def test_ddp_checkpoints_at_a_store_url_resume_elsewhere_bitwise(workdir, prepared_digits, s3):
    store_disk = point_at(workdir, s3)
    section = {"epochs": EPOCHS, "checkpoint_every_steps": 20}
    ref = train(workdir, prepared_digits, out="ref", tracking={"enabled": False}, train=section)
    section["checkpoint_dir"] = "s3://scalelab/lab/ddp"  # a URL inside the store: its credentials
    resumed = kill_after_first_checkpoint(workdir, prepared_digits, {"train": section}, store_disk / "ddp")
    rerun = run_cli("train", "--data", str(prepared_digits), "--out", "elsewhere", cwd=workdir)
    assert f"| {resumed}/{TOTAL} [" in rerun.stderr, rerun.stderr[-3000:]
    assert_same_weights(weights(ref), weights(workdir / "elsewhere"))


@pytest.mark.integration
@pytest.mark.parametrize("case", ["unreachable", "refused"])
def test_store_checkpoints_with_the_store_unreachable_stop_before_anything_starts(workdir, prepared_digits, s3, case):
    point_at(workdir, s3)
    if case == "unreachable":
        from scalelab.storage import server

        server.stop(s3.base)
    else:  # wrong credentials in .dvc/config.local
        local = workdir / ".dvc/config.local"
        local.write_text(local.read_text().replace(s3.secret_access_key, "wrong-secret"))
    write_params(workdir / "params.yaml", tiny_params(train={"checkpoint_dir": "store"}))
    proc = run_cli("train", "--data", str(prepared_digits), "--out", "out", cwd=workdir, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    why = "cannot be reached" if case == "unreachable" else "credentials were refused"
    assert len(lines) == 1 and why in lines[0] and s3.endpoint in lines[0], proc.stderr
    assert "wrong-secret" not in proc.stderr
    assert not (workdir / "out/resolved.json").exists() and not (workdir / "mlflow.db").exists()


@pytest.mark.integration
def test_store_checkpoints_without_a_store_are_refused_in_one_line(workdir, prepared_digits):
    write_params(workdir / "params.yaml", tiny_params(train={"checkpoint_dir": "store"}))
    proc = run_cli("train", "--data", str(prepared_digits), "--out", "out", cwd=workdir, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.checkpoint_dir = 'store'" in lines[0] and "no store" in lines[0], proc.stderr
    assert not (workdir / "mlflow.db").exists()


@pytest.mark.slow  # two training jobs, the store stopped under the first
def test_the_store_stopped_during_checkpoint_uploads_is_one_line_and_the_rerun_completes(
    workdir, prepared_digits, tmp_path
):
    base = tmp_path / "s3"
    with s3_server(base) as server:
        store_disk = point_at(workdir, server)
        credentials = (server.access_key_id, server.secret_access_key)
        sections = {"train": {**FSDP, "epochs": EPOCHS, "checkpoint_every_steps": 20, "checkpoint_dir": "store"}}
        write_params(workdir / "params.yaml", tiny_params(**sections))
        proc, log = start_job(workdir, prepared_digits, "out")
        two = lambda: len(committed(store_disk)) >= 2  # noqa: E731
        wait_for(two, 180, "two checkpoints in the store", proc, log=log, poll_s=0.01)
    # the server is stopped: the next upload fails
    assert proc.wait(timeout=300) != 0, output_tail(log)
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    assert "scalelab train: error:" in lines[-1] and "s3://scalelab/lab" in lines[-1], output_tail(log)
    assert not (workdir / "out/model.pt").exists()
    previous, newest = [int(p.name.split("-")[1].split(".")[0]) for p in committed(store_disk)[-2:]]
    with s3_server(base, credentials=credentials) as server:  # the same objects, on a new port
        point_at(workdir, server)
        # and the newest one's upload stopped before its commit marker: it is never loaded
        [folder] = {p.parent for p in committed(store_disk)}
        fs, root = filesystem(f"s3://scalelab/lab/checkpoints/{folder.name}", server.store())
        fs.rm_file(f"{root}/step-{newest:08d}.dcp/extra.pt")
        rerun = run_cli("train", "--data", str(prepared_digits), "--out", "out", cwd=workdir)
    assert f"| {previous}/{TOTAL} [" in rerun.stderr, rerun.stderr[-3000:]
    assert (workdir / "out/model.pt").is_file()
