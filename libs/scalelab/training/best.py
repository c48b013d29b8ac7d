"""The best validation value so far, and early stopping on it.

`Best` is one of the job's stateful parts: its `state_dict()` goes into every checkpoint, so a
resumed job keeps the best value, its step and the patience counter.
"""

from __future__ import annotations

import math
from typing import Any


class Best:
    """Tracks `metric` (a validation metric) in `mode` ('min' or 'max'); with `patience` > 0,
    `should_stop` turns true after that many validations in a row without a better value."""

    def __init__(self, metric: str, mode: str, patience: int = 0) -> None:
        self.metric, self.mode, self.patience = metric, mode, patience
        self.value: float | None = None
        self.step = 0
        self.since_better = 0  # validations since the last better value

    def update(self, metrics: dict[str, float], step: int) -> bool:
        """Takes one validation's metrics; True when `metric` is better than every earlier one."""
        value = metrics[self.metric]
        better = math.isfinite(value) and (
            self.value is None or (value < self.value if self.mode == "min" else value > self.value)
        )
        if better:
            self.value, self.step, self.since_better = value, step, 0
        else:
            self.since_better += 1
        return better

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.since_better >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "step": self.step, "since_better": self.since_better}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value, self.step, self.since_better = state["value"], state["step"], state["since_better"]
