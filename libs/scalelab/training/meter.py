"""Loss and throughput over logging windows, with the first (untimed) steps left out of timing.

A checkpoint holds each rank's open window (`window_state`): a job stopped between two logging
steps resumes with the same partial loss sum, so the next window averages the same steps, in the
same order, as an uninterrupted run would. It also holds the timed steps and seconds so far, so
the whole job's throughput (`summary`) counts every try, not only the last one.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from scalelab.runtime import dist


class Meter:
    """Aggregates loss and timing over a logging window; the first `untimed_steps` are left out of timing."""

    def __init__(self, untimed_steps: int, samples_per_step: int) -> None:
        self.untimed_steps, self.samples_per_step = untimed_steps, samples_per_step
        self.loss_sum: torch.Tensor | None = None
        self.window_steps = 0
        self.timed_steps, self.timed_s = 0, 0.0
        self.untimed = 0  # steps of the open window run before a resume: not in this process's clock
        self.mark = time.perf_counter()

    def window_state(self) -> dict[str, Any]:
        """This rank's open window, for a checkpoint (tensors and ints only)."""
        loss_sum = None if self.loss_sum is None else self.loss_sum.detach().cpu()
        return {"loss_sum": loss_sum, "steps": self.window_steps, "timed": [self.timed_steps, self.timed_s]}

    def load_window(self, state: dict[str, Any] | None, device: torch.device) -> None:
        """Reopens a window saved by `window_state` in an earlier try, and its timing totals."""
        if state and state["steps"]:
            self.loss_sum = state["loss_sum"].to(device)
            self.window_steps = self.untimed = state["steps"]
        if state and "timed" in state:
            self.timed_steps, self.timed_s = int(state["timed"][0]), float(state["timed"][1])

    def add(self, step: int, loss: torch.Tensor) -> None:
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.window_steps += 1
        if step == self.untimed_steps:  # the untimed steps end here: timing starts from now
            self.mark = time.perf_counter()

    def window(self, step: int, device: torch.device) -> dict[str, float]:
        """Closes the window: loss averaged over steps and ranks, throughput after warm-up."""
        if device.type == "cuda":
            torch.cuda.synchronize()  # note: a CPU-GPU sync point, once per window
        now = time.perf_counter()
        sums = torch.stack([self.loss_sum.float(), torch.tensor(float(self.window_steps), device=device)])
        loss_sum, steps = dist.all_reduce_sum(sums).tolist()
        out = {"train_loss": loss_sum / steps}
        timed = min(self.window_steps - self.untimed, step - self.untimed_steps)
        if timed > 0:
            elapsed_s = now - self.mark
            self.timed_steps += timed
            self.timed_s += elapsed_s
            out["step_time_ms"] = 1000.0 * elapsed_s / timed
            out["samples_per_s"] = self.samples_per_step * timed / elapsed_s
        self.loss_sum, self.window_steps, self.untimed, self.mark = None, 0, 0, now
        return out

    def window_is_finite(self, device: torch.device) -> bool:
        """True when the open window's loss is finite on every rank (a one-element all-reduce)."""
        bad = self.loss_sum is not None and not bool(torch.isfinite(self.loss_sum).item())
        return not dist.any_rank(bad, device.type)

    def summary(self) -> dict[str, float]:
        if not self.timed_steps:
            return {}
        return {
            "samples_per_s": self.samples_per_step * self.timed_steps / self.timed_s,
            "step_time_ms": 1000.0 * self.timed_s / self.timed_steps,
        }
