"""Learning-rate schedules: a linear warm-up, then the curve of a schedule of config/names.py
(constant, cosine, linear, or wsd: stable, then a linear decay over the last steps).

`lr_factor` is the formula, a pure function of the optimizer steps taken; `build` wraps it in
torch's `LambdaLR`, whose `state_dict()` (the steps taken) goes into every checkpoint, so a
resumed job continues the same curve. The optimizer's own state holds the current lr. A new
schedule is one entry in `config.names.LR_SCHEDULES`, which holds its curve: nothing here changes.
"""

from __future__ import annotations

import functools

import torch

from scalelab.config import names


def lr_factor(
    steps_done: int,
    *,
    total_steps: int,
    schedule: str,
    warmup_steps: int,
    min_ratio: float,
    decay_fraction: float = 1.0,
) -> float:
    """The multiplier of the base lr for the optimizer step after `steps_done` steps.

    Warm-up: (k + 1) / warmup_steps for the first `warmup_steps` steps. Then `constant` stays at 1;
    the others fall from 1 to `min_ratio`, reached at the last of `total_steps`, along their curve
    (`decay_fraction`: wsd's share of the steps after the warm-up spent decaying).
    """
    decay = names.LR_SCHEDULES[names.check("lr_schedule", schedule, names.LR_SCHEDULES)].decay  # never a fallback
    if steps_done < warmup_steps:
        return (steps_done + 1) / warmup_steps
    if decay is None:
        return 1.0
    decay_steps = max(total_steps - warmup_steps - 1, 1)
    progress = min((steps_done - warmup_steps) / decay_steps, 1.0)
    return min_ratio + (1.0 - min_ratio) * decay(progress, decay_fraction)


def build(
    optimizer: torch.optim.Optimizer,
    *,
    total_steps: int,
    schedule: str = "constant",
    warmup_steps: int = 0,
    min_ratio: float = 0.0,
    decay_fraction: float = 1.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler stepped once per optimizer step (Loop.step).

    Raises:
        ConfigError: `schedule` is not a name of config/names.py (checked here, before any step).
    """
    names.check("lr_schedule", schedule, names.LR_SCHEDULES)
    factor = functools.partial(
        lr_factor,
        total_steps=total_steps,
        schedule=schedule,
        warmup_steps=warmup_steps,
        min_ratio=min_ratio,
        decay_fraction=decay_fraction,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
