"""Checkpoints of other params, data or code are never resumed and never deleted: they are moved
aside into `stale-<fingerprint>/`, where `train.resume_from` can take them up. Only known damage is
skipped when loading; anything else stops the job with its cause."""

import logging
import os
import signal
from fractions import Fraction

import pytest
import torch

from scalelab.training import checkpoint
from scalelab.training.checkpoint import Checkpointer, CheckpointError
from scalelab.training.submit import Interrupted


def lineage(folder, fp: str, steps=(10, 20), sharded: bool = False) -> dict[str, bytes]:
    """A job of fingerprint `fp` that claimed `folder`, saved `steps` and best.pt; returns the files
    (relative path: bytes) it left there."""
    ckpt = Checkpointer(folder, fp, keep=len(steps))
    ckpt.claim()
    ckpt.record(f"run-{fp}")
    for step in steps:
        if sharded:  # an fsdp checkpoint: a step-XXXXXXXX.dcp folder of DCP shards and extra.pt
            ckpt.save(step, {"epoch": 0}, {"model": {"w": torch.full((4,), float(step))}})
        else:
            ckpt.save(step, {"w": torch.tensor([step])})
    (folder / "best.pt").write_bytes(b"best of " + fp.encode())
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("sharded", [False, True], ids=["full", "sharded"])
def test_a_fingerprint_change_moves_the_checkpoints_aside_and_deletes_none(tmp_path, caplog, sharded):
    folder = tmp_path / "checkpoints"
    before = lineage(folder, "aaaa1111", sharded=sharded)
    with caplog.at_level(logging.WARNING, logger=checkpoint.__name__):
        assert Checkpointer(folder, "bbbb2222").claim() is None
    stale = folder / "stale-aaaa1111"
    after = {str(p.relative_to(stale)): p.read_bytes() for p in stale.rglob("*") if p.is_file()}
    assert after == before  # every checkpoint, best.pt and job.json, byte for byte
    assert [p.name for p in folder.iterdir()] == ["stale-aaaa1111"]  # nothing of the old job left beside it
    assert Checkpointer(folder, "bbbb2222").load_latest() is None  # and never resumed
    lines = [r.getMessage() for r in caplog.records if r.name == checkpoint.__name__]  # (DCP logs its events)
    assert len(lines) == 1 and str(stale) in lines[0] and f"train.resume_from: {stale}" in lines[0], lines
    assert "2 checkpoint(s) of fingerprint aaaa1111 (newest: step 20)" in lines[0]


def test_the_newest_stale_sets_are_kept_and_the_one_resumed_from_is_never_pruned(tmp_path):
    folder = tmp_path / "checkpoints"
    for fp in ("f1", "f2", "f3", "f4", "f5"):
        # f5 resumes from f2, then the oldest set: it stays, beside the newest KEEP_STALE
        keep = folder / "stale-f2" if fp == "f5" else None
        ckpt = Checkpointer(folder, fp, keep=2)
        ckpt.claim(keep=keep)
        ckpt.record(f"run-{fp}")
        ckpt.save(10, {"w": torch.tensor([1])})
    assert checkpoint.KEEP_STALE == 2
    names = sorted(p.name for p in Checkpointer(folder, "f5").stale_sets())
    assert names == ["stale-f2", "stale-f3", "stale-f4"]  # f1 pruned: older than the newest two, not resumed from
    assert (folder / "stale-f2" / "step-00000010.pt").is_file()


def test_a_fingerprint_moved_aside_twice_keeps_both_sets(tmp_path):
    folder = tmp_path / "checkpoints"
    lineage(folder, "f1", steps=(10,))
    Checkpointer(folder, "f2").claim()  # moves f1 aside
    Checkpointer(folder, "f2").record("run-f2")  # and saves nothing
    lineage(folder, "f1", steps=(30,))  # f1 again, from step 0: f2 left nothing to move
    Checkpointer(folder, "f2").claim()  # moves the second f1 aside, beside the first
    assert Checkpointer(folder / "stale-f1", "f1").steps() == [10]
    assert Checkpointer(folder / "stale-f1-2", "f1").steps() == [30]


def test_a_job_killed_before_its_first_checkpoint_leaves_no_stale_set(tmp_path):
    folder = tmp_path / "checkpoints"
    first = Checkpointer(folder, "f1")
    first.claim()
    first.record("run-1")
    assert Checkpointer(folder, "f2").claim() is None
    assert list(folder.iterdir()) == []  # only its job.json was there: nothing worth keeping


def test_a_move_aside_killed_halfway_is_finished_by_the_next_claim(tmp_path, monkeypatch):
    folder = tmp_path / "checkpoints"
    before = lineage(folder, "f1", steps=(10, 20))
    real = os.replace
    moved = []

    def dies_after_two(src, dst):
        if len(moved) == 2:
            raise KeyboardInterrupt  # the job is killed in the middle of the move
        moved.append(src)
        real(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", dies_after_two)
    with pytest.raises(KeyboardInterrupt):
        Checkpointer(folder, "f2").claim()
    monkeypatch.setattr(checkpoint.os, "replace", real)
    Checkpointer(folder, "f2").claim()
    stale = folder / "stale-f1"
    assert {str(p.relative_to(stale)): p.read_bytes() for p in stale.rglob("*") if p.is_file()} == before
    assert [p.name for p in folder.iterdir()] == ["stale-f1"]


def test_a_checkpoint_that_weights_only_refuses_stops_the_load_with_its_cause(tmp_path):
    ckpt = Checkpointer(tmp_path, "fp", keep=3)
    ckpt.save(10, {"w": torch.tensor([1])})
    ckpt.save(20, {"w": torch.tensor([2]), "ratio": Fraction(1, 3)})  # a type weights_only refuses
    with pytest.raises(CheckpointError, match=r"step-00000020\.pt is intact but cannot be loaded: .*Fraction"):
        ckpt.load_latest()  # not a silent fall-back to step 10: every later save would have it too


def test_known_damage_is_still_skipped(tmp_path):
    ckpt = Checkpointer(tmp_path, "fp", keep=5)
    ckpt.save(10, {"w": torch.tensor([1])})
    ckpt.save(20, {"w": torch.tensor([2])})
    ckpt.save(30, {"w": torch.tensor([3])})
    ckpt.path(30).write_bytes(ckpt.path(30).read_bytes()[:-100])  # truncated
    ckpt.path(20).write_bytes(b"\0" * 4096)  # not a zip at all
    (tmp_path / "step-00000040.dcp").mkdir()  # a sharded folder without its extra.pt
    assert ckpt.load_latest()["step"] == 10


def test_the_interrupted_message_sees_sharded_checkpoints(tmp_path):
    (tmp_path / "checkpoints/step-00000020.dcp").mkdir(parents=True)
    (tmp_path / "checkpoints/step-00000030.dcp").mkdir()
    message = str(Interrupted(signal.SIGTERM, tmp_path, None))
    assert "it resumes from step 30" in message and "step 0" not in message, message
