"""Crash-safe checkpoints: the writer is SIGKILLed at enumerated points inside a save, and loading
always returns the newest complete checkpoint. One job per output folder: a second one fails at once."""

import contextlib
import json
import os
import signal
import subprocess
import sys

import psutil
import pytest
import torch

from helpers import BIN, record_reliability, says_why, tiny_params, wait_for, write_params
from scalelab.training.checkpoint import Checkpointer

# the child saves `done` checkpoints, then dies at `point` inside the next save
CHILD = r"""
import os, signal, sys, tempfile, torch
from pathlib import Path
from scalelab.runtime import io as sio
from scalelab.training.checkpoint import Checkpointer

folder, point, done = sys.argv[1], sys.argv[2], int(sys.argv[3])
ckpt = Checkpointer(folder, "fp", keep=2)
state = lambda step: {"w": torch.full((256, 256), float(step))}
for step in range(1, done + 1):
    ckpt.save(step, state(step))

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

real_fdopen, real_mkstemp = os.fdopen, tempfile.mkstemp
class HalfWriter:
    def __init__(self, fh): self.fh = fh
    def __enter__(self): return self
    def __exit__(self, *a): return False
    def write(self, data): self.fh.write(data[: len(data) // 2]); self.fh.flush(); die()
if point == "serialize":
    torch.save = die
elif point == "mkstemp":
    tempfile.mkstemp = lambda *a, **k: (real_mkstemp(*a, **k), die())[0]
elif point == "write":
    os.fdopen = lambda fd, mode: HalfWriter(real_fdopen(fd, mode))
elif point == "fsync":
    os.fsync = die
elif point == "replace":
    os.replace = die
elif point == "prune":
    Path.unlink = die
ckpt.save(done + 1, state(done + 1))
"""
POINTS = ["serialize", "mkstemp", "write", "fsync", "replace", "prune"]
TRIALS = {"trials": 0, "faults_injected": 0, "recovered_newest_complete": 0}

# Each trial is a process of its own, forked from this one, which has imported torch and the
# checkpoint modules once (the trials would otherwise each spend ~1.5 s of CPU importing them).
# It reads one trial per line (script, args, stderr file) and answers the trial's exit status.
ZYGOTE = r"""
import json, os, sys, traceback
import torch, torch.distributed.checkpoint.filesystem, scalelab.training.checkpoint  # noqa: F401
for line in sys.stdin:
    script, args, stderr = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        sys.argv = ["-c", *args]
        code = 0  # a trial that did not die where it should exits 0, or 1 with its traceback
        try:
            exec(compile(script, "<trial>", "exec"), {"__name__": "__main__"})
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@pytest.fixture(scope="module")
def zygote():
    proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield proc
    proc.stdin.close()
    proc.wait(timeout=60)


def trial_stderr(folder):
    """Where the trial on `folder` writes its stderr."""
    return folder.parent / f"{folder.name}.stderr"


def trial(zygote, script: str, folder, point: str, done: int) -> tuple[int, str]:
    """Runs one trial in a fresh process forked by the zygote; returns its exit status and stderr."""
    stderr = trial_stderr(folder)
    zygote.stdin.write(json.dumps([script, [str(folder), point, str(done)], str(stderr)]) + "\n")
    zygote.stdin.flush()
    return int(zygote.stdout.readline()), stderr.read_text(errors="replace")


@pytest.mark.integration  # a python process importing torch: seconds each, more under load
@pytest.mark.xdist_group("checkpoint-faults")  # one worker counts every trial for reliability.json
@pytest.mark.parametrize("done", [1, 2, 3, 4])
@pytest.mark.parametrize("point", POINTS)
def test_a_save_killed_anywhere_leaves_the_newest_complete_checkpoint(tmp_path, zygote, point, done):
    done += point == "prune"  # keep=2: the first save that prunes is the third
    folder = tmp_path / "ckpt"
    code, stderr = trial(zygote, CHILD, folder, point, done)
    TRIALS["trials"] += 1
    assert code == -signal.SIGKILL, stderr[-2000:]
    TRIALS["faults_injected"] += 1
    with says_why(trial_stderr(folder)):
        state = Checkpointer(folder, "fp", keep=2).load_latest()
        newest = done + 1 if point == "prune" else done  # past os.replace the new one is complete
        assert state is not None and state["step"] == newest and bool((state["w"] == newest).all())
    TRIALS["recovered_newest_complete"] += 1


# the same for the sharded format (fsdp): torch.distributed.checkpoint writes the shards, then the
# metadata; rank 0 writes extra.pt and renames the hidden folder (here one process, no process group)
SHARDED_CHILD = r"""
import os, shutil, signal, sys, torch
import torch.distributed.checkpoint.filesystem as fs
import scalelab.training.checkpoint_files as files_module  # the local folder's writes (LocalFiles)
from scalelab.training.checkpoint import Checkpointer

folder, point, done = sys.argv[1], sys.argv[2], int(sys.argv[3])
ckpt = Checkpointer(folder, "fp", keep=2)
shards = lambda step: {"model": {"w": torch.full((256, 256), float(step))}}
for step in range(1, done + 1):
    ckpt.save(step, {"epoch": 0}, shards(step))

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def half_then_die(transforms, stream, *args, **kwargs):  # a shard file cut off in the middle
    stream.write(b"x" * 1000)
    stream.flush()
    die()
real_replace = os.replace
if point == "serialize":
    torch.save = die
elif point == "shard":
    fs._write_item = half_then_die
elif point == "metadata":
    fs.FileSystemWriter.finish = die
elif point == "extra":
    files_module.atomic_write_bytes = die
elif point == "rename":  # the commit: the hidden folder renamed into place
    os.replace = lambda src, dst: die() if os.path.isdir(src) else real_replace(src, dst)
elif point == "prune":
    shutil.rmtree = die
ckpt.save(done + 1, {"epoch": 0}, shards(done + 1))
"""
SHARDED_POINTS = ["serialize", "shard", "metadata", "extra", "rename", "prune"]


@pytest.mark.integration  # a python process importing torch.distributed.checkpoint: seconds each
@pytest.mark.xdist_group("checkpoint-faults")
@pytest.mark.parametrize("done", [1, 3])
@pytest.mark.parametrize("point", SHARDED_POINTS)
def test_a_sharded_save_killed_anywhere_leaves_the_newest_complete_checkpoint(tmp_path, zygote, point, done):
    from scalelab.training.checkpoint import read_shards

    done += point == "prune"
    folder = tmp_path / "ckpt"
    code, stderr = trial(zygote, SHARDED_CHILD, folder, point, done)
    TRIALS["trials"] += 1
    assert code == -signal.SIGKILL, stderr[-2000:]
    TRIALS["faults_injected"] += 1
    with says_why(trial_stderr(folder)):
        state = Checkpointer(folder, "fp", keep=2).load_latest()
        newest = done + 1 if point == "prune" else done  # past the rename the new one is complete
        assert state is not None and state["step"] == newest and state["shards"].endswith(f"step-{newest:08d}.dcp")
        target = {"model": {"w": torch.zeros(256, 256)}}
        read_shards(state["shards"], target)
        assert bool((target["model"]["w"] == newest).all())
    TRIALS["recovered_newest_complete"] += 1


@pytest.fixture(scope="module", autouse=True)
def write_trial_figures():
    yield
    if TRIALS["trials"]:  # this process ran the trials (not only the second-job test)
        record_reliability("checkpoint_faults", dict(TRIALS, points=POINTS))


@pytest.mark.slow  # a whole training job beside the refused one
@pytest.mark.distributed
def test_a_second_job_on_the_same_folder_fails_at_once_and_deletes_nothing(workdir, prepared_digits):
    write_params(workdir / "params.yaml", tiny_params(train={"epochs": 60}, tracking={"system_metrics_interval_s": 0}))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    cmd = [str(BIN / "scalelab"), "train", "--data", str(prepared_digits), "--out", "out"]
    log = workdir / "first.log"  # not under out/, whose files the test lists
    with open(log, "wb") as out:
        first = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=out)
    ckpts = workdir / "out/checkpoints"
    wait_for(lambda: list(ckpts.glob("step-*")), 300, "the first job's first checkpoint", first, log=log, poll_s=0.2)
    # the first job's ranks are paused, so that under any load the job is still running when the
    # second one looks (its launcher, which holds the folder's lock, keeps running)
    ranks = psutil.Process(first.pid).children(recursive=True)
    for rank in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            rank.suspend()
    try:
        before = sorted(p.name for p in (workdir / "out").rglob("*") if p.is_file())
        second = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    finally:
        for rank in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.resume()
    assert second.returncode == 2, second.stderr
    line = second.stderr.strip().splitlines()[-1]
    assert f"{workdir / 'out'}" in line or "out is in use by another job" in line, line
    assert f'"pid": {first.pid}' in line, line  # names the holder
    with says_why(log):
        assert first.wait(timeout=600) == 0
    after = {p.name for p in (workdir / "out").rglob("*") if p.is_file()}
    # Only what the first job itself replaces may go: old step checkpoints (it keeps the newest N)
    # and the temporary file of any atomic write that was in flight when `before` was listed
    # (a step checkpoint's or best.pt's, `.<name>.<suffix>.tmp`, renamed since).
    rotated = {n for n in before if n.startswith("step-") or (n.startswith(".") and n.endswith(".tmp"))}
    assert {"model.pt", "run.json"} <= after and set(before) - after <= rotated
