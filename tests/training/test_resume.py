"""A run stopped at an arbitrary step (mid-epoch) and resumed ends bitwise equal to an uninterrupted one."""

import pytest
import torch

from helpers import histories, tiny_params, train_here, write_params
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
            slurm={"stop_check_every_steps": 1},
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


def test_the_ranks_check_for_a_stop_every_stop_check_every_steps(workdir, prepared_digits):
    write_params(
        workdir / "p.yaml",
        tiny_params(
            train={"strategy": "single", "nproc_per_node": 1, "checkpoint_every_steps": 1000},
            tracking={"enabled": False},
            slurm={"stop_check_every_steps": 10},
        ),
    )
    flag = StopAtCheck(3)  # the signal is seen at the third check: step 30, not step 3
    assert train_here(load_params(workdir / "p.yaml"), prepared_digits, workdir / "pre", stop=flag)["step"] == 30
    assert flag.calls == 3


class CrashAtCheck(StopAtCheck):
    """Dies (an exception, as a node failure would end the job) just before step `k` ends."""

    def everywhere(self, device: torch.device) -> bool:
        if super().everywhere(device):
            raise RuntimeError(f"injected crash at step {self.k}")
        return False


@pytest.mark.integration  # three training runs in this process, into a real MLflow store
@pytest.mark.parametrize("fault", ["stop", pytest.param("crash", marks=pytest.mark.slow)])
def test_metric_history_after_a_stop_between_logging_steps_equals_an_uninterrupted_run(
    workdir, store_ready, prepared_digits, fault
):
    # log every 5 steps, checkpoint every 7: the stop (step 43) and the crash (step 47, resumed from
    # the checkpoint at 42, steps 43..47 recomputed) both fall inside an open logging window
    write_params(
        workdir / "p.yaml",
        tiny_params(
            train={"epochs": 3, "strategy": "single", "nproc_per_node": 1, "checkpoint_every_steps": 7},
            slurm={"stop_check_every_steps": 1},
        ),
    )
    params = load_params(workdir / "p.yaml")
    ref = train_here(params, prepared_digits, workdir / "ref")
    if fault == "stop":
        assert train_here(params, prepared_digits, workdir / "pre", stop=StopAtCheck(43))["step"] == 43
    else:
        with pytest.raises(RuntimeError, match="injected crash at step 47"):
            train_here(params, prepared_digits, workdir / "pre", stop=CrashAtCheck(47))
    got = train_here(params, prepared_digits, workdir / "pre")
    assert got["run_id"] != ref["run_id"]
    total = ref["total_steps"]
    want, have = histories(ref["run_id"]), histories(got["run_id"])
    logged = {"train_loss", "lr", "grad_norm", "val_loss", "val_accuracy", "ranks_in_sync"}
    assert set(have) == logged | {"best_step", "best_val_loss"}
    train_steps = [s for s, _ in have["train_loss"]]
    assert train_steps == sorted({*range(5, total + 1, 5), total}), train_steps  # no gap, none twice
    assert have == want  # equal values, bit for bit, at every step
