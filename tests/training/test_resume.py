"""A run stopped at an arbitrary step (mid-epoch) and resumed ends bitwise equal to an uninterrupted one."""

import torch

from helpers import tiny_params, train_here, write_params
from scalelab.config import load_params
from scalelab.runtime.signals import StopFlag


class StopAtCheck(StopFlag):
    """Behaves as if the preemption signal arrived just before step `k` ended."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k, self.calls = k, 0

    def everywhere(self, device: torch.device) -> bool:
        self.calls += 1
        return self.calls == self.k


def test_stop_mid_epoch_then_resume_is_bitwise_identical(workdir, prepared_digits):
    write_params(
        workdir / "p.yaml",
        tiny_params(
            train={"epochs": 3, "strategy": "single", "nproc_per_node": 1, "checkpoint_every_steps": 1000},
            tracking={"enabled": False},
        ),
    )
    params = load_params(workdir / "p.yaml")
    train_here(params, prepared_digits, workdir / "ref")
    stopped = train_here(params, prepared_digits, workdir / "pre", stop=StopAtCheck(45))
    assert stopped["preempted"] and stopped["step"] == 45  # 39 steps per epoch: mid-epoch 2
    assert not (workdir / "pre/model.pt").exists()
    train_here(params, prepared_digits, workdir / "pre")
    ref = torch.load(workdir / "ref/model.pt", weights_only=True)["model"]
    got = torch.load(workdir / "pre/model.pt", weights_only=True)["model"]
    assert all(torch.equal(ref[k], got[k]) for k in ref)
