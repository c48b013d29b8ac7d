"""Learning-rate schedules: a linear warm-up, then constant, cosine or linear decay.

`lr_factor` is the formula, a pure function of the optimizer steps taken; `build` wraps it in
torch's `LambdaLR`, whose `state_dict()` (the steps taken) goes into every checkpoint, so a
resumed job continues the same curve. The optimizer's own state holds the current lr.
"""

from __future__ import annotations

import functools
import math

import torch


def lr_factor(steps_done: int, *, total_steps: int, schedule: str, warmup_steps: int, min_ratio: float) -> float:
    """The multiplier of the base lr for the optimizer step after `steps_done` steps.

    Warm-up: (k + 1) / warmup_steps for the first `warmup_steps` steps. Then `constant` stays at 1;
    `cosine` and `linear` fall from 1 to `min_ratio`, reached at the last of `total_steps`.
    """
    if steps_done < warmup_steps:
        return (steps_done + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(total_steps - warmup_steps - 1, 1)
    progress = min((steps_done - warmup_steps) / decay_steps, 1.0)
    decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return min_ratio + (1.0 - min_ratio) * decay


def build(
    optimizer: torch.optim.Optimizer,
    *,
    total_steps: int,
    schedule: str = "constant",
    warmup_steps: int = 0,
    min_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler stepped once per optimizer step (Loop.step)."""
    factor = functools.partial(
        lr_factor, total_steps=total_steps, schedule=schedule, warmup_steps=warmup_steps, min_ratio=min_ratio
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
