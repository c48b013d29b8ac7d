"""Loss and throughput over logging windows, with warm-up steps left out of timing."""

from __future__ import annotations

import time

import torch

from scalelab.runtime import dist


class Meter:
    """Aggregates loss and timing over a logging window; warm-up steps are left out of timing."""

    def __init__(self, warmup_steps: int, samples_per_step: int) -> None:
        self.warmup_steps, self.samples_per_step = warmup_steps, samples_per_step
        self.loss_sum: torch.Tensor | None = None
        self.window_steps = 0
        self.timed_steps, self.timed_s = 0, 0.0
        self.mark = time.perf_counter()

    def add(self, step: int, loss: torch.Tensor) -> None:
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.window_steps += 1
        if step == self.warmup_steps:  # warm-up ends here: timing starts from now
            self.mark = time.perf_counter()

    def window(self, step: int, device: torch.device) -> dict[str, float]:
        """Closes the window: loss averaged over steps and ranks, throughput after warm-up."""
        if device.type == "cuda":
            torch.cuda.synchronize()  # note: a CPU-GPU sync point, once per window
        now = time.perf_counter()
        sums = torch.stack([self.loss_sum.float(), torch.tensor(float(self.window_steps), device=device)])
        loss_sum, steps = dist.all_reduce_sum(sums).tolist()
        out = {"train_loss": loss_sum / steps}
        timed = min(self.window_steps, step - self.warmup_steps)
        if timed > 0:
            elapsed_s = now - self.mark
            self.timed_steps += timed
            self.timed_s += elapsed_s
            out["step_time_ms"] = 1000.0 * elapsed_s / timed
            out["samples_per_s"] = self.samples_per_step * timed / elapsed_s
        self.loss_sum, self.window_steps, self.mark = None, 0, now
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
