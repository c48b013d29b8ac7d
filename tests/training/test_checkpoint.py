"""Checkpoints: atomic, pruned, fingerprinted; a damaged newest one falls back to an older one
(tests/training/test_stale_checkpoints.py: those of another fingerprint, and what is not damage)."""

import torch

from scalelab.training.checkpoint import Checkpointer


def test_save_prunes_and_loads_newest(tmp_path):
    ckpt = Checkpointer(tmp_path, "abc", keep=2)
    for step in (10, 20, 30):
        ckpt.save(step, {"w": torch.tensor([step])})
    assert ckpt.steps() == [30, 20]
    assert ckpt.load_latest()["w"].item() == 30
    assert not list(tmp_path.glob("*.tmp"))


def test_damaged_newest_falls_back(tmp_path):
    ckpt = Checkpointer(tmp_path, "abc", keep=3)
    ckpt.save(10, {"w": 1})
    ckpt.save(20, {"w": 2})
    ckpt.path(20).write_bytes(ckpt.path(20).read_bytes()[:50])
    assert ckpt.load_latest()["step"] == 10


def test_other_fingerprint_is_never_resumed(tmp_path):
    Checkpointer(tmp_path, "old", keep=2).save(10, {"w": 1})
    assert Checkpointer(tmp_path, "new", keep=2).load_latest() is None


def test_claim_keeps_run_id_for_same_params_and_moves_others_aside(tmp_path):
    folder = tmp_path / "ck"
    first = Checkpointer(folder, "fp1")
    assert first.claim() is None
    first.record("run-1")
    first.save(5, {"w": 1})
    assert Checkpointer(folder, "fp1").claim() == "run-1"
    other = Checkpointer(folder, "fp2")
    assert other.claim() is None
    assert other.steps() == [] and Checkpointer(folder / "stale-fp1", "fp1").steps() == [5]
