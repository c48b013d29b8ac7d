"""Learning-rate schedules: a linear warm-up, then constant, cosine or linear decay.

`lr_factor` is the formula, a pure function of the optimizer steps taken; `build` wraps it in
torch's `LambdaLR`, whose `state_dict()` (the steps taken) goes into every checkpoint, so a
resumed job continues the same curve. The optimizer's own state holds the current lr.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from scalelab.config import names


def lr_factor(steps_done: int, *, total_steps: int, schedule: str, warmup_steps: int, min_ratio: float) -> float:
    """The multiplier of the base lr for the optimizer step after `steps_done` steps.

    Warm-up: (k + 1) / warmup_steps for the first `warmup_steps` steps. Then `constant` stays at 1;
    `cosine` and `linear` fall from 1 to `min_ratio`, reached at the last of `total_steps`.
    """
    decay = DECAYS[names.check("lr_schedule", schedule, names.LR_SCHEDULES)]  # never a fallback
    if steps_done < warmup_steps:
        return (steps_done + 1) / warmup_steps
    if decay is None:
        return 1.0
    decay_steps = max(total_steps - warmup_steps - 1, 1)
    progress = min((steps_done - warmup_steps) / decay_steps, 1.0)
    return min_ratio + (1.0 - min_ratio) * decay(progress)


# each schedule of config/names.py after the warm-up: None (constant), or the decay from 1 to 0 over
# progress 0..1 (the same keys: a test checks it)
DECAYS: dict[str, Callable[[float], float] | None] = {
    "constant": None,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
    "linear": lambda progress: 1.0 - progress,
}


def build(
    optimizer: torch.optim.Optimizer,
    *,
    total_steps: int,
    schedule: str = "constant",
    warmup_steps: int = 0,
    min_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler stepped once per optimizer step (Loop.step).

    Raises:
        ConfigError: `schedule` is not a name of config/names.py (checked here, before any step).
    """
    names.check("lr_schedule", schedule, names.LR_SCHEDULES)
    factor = functools.partial(
        lr_factor, total_steps=total_steps, schedule=schedule, warmup_steps=warmup_steps, min_ratio=min_ratio
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
