"""Repeats in rounds, and what to do with a repeat taken while the machine was busy.

The study's timed repeats are taken in rounds: one repeat of every cell, then the next round
(the order reverses every other round: a, b, c, c, b, a, ...), so that load which comes and goes
touches every cell alike. Each repeat carries what other processes (and the hypervisor: steal)
took of the machine's cores during it (runtime.disturbance). A repeat during which they held more
than `speedup.max_others_cpu_share` is *busy*: it is not kept, and the cell takes another repeat
in a later round, up to `speedup.max_retries` extra repeats; past that, busy repeats are dropped.
A cell that kept no repeat at all has no figure ("invalid": the machine was busy throughout).

    tallies = take_rounds(["a", "b"], lambda name: figures_of_one_repeat(name), Policy.of(cfg))
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
SHARE_KEYS = ("others_cpu_share", "steal_share", "load_1m")


@dataclass(frozen=True)
class Policy:
    repeats: int  # repeats to keep per cell
    max_share: float  # others + steal above this share of the cores: a busy repeat
    max_retries: int  # extra repeats a cell may take in place of busy ones

    @classmethod
    def of(cls, cfg: Any) -> Policy:
        """From a SpeedupConfig."""
        return cls(cfg.repeats, cfg.max_others_cpu_share, cfg.max_retries)


@dataclass
class Tally:
    """One cell's repeats so far: each a dict with `repeat_s` and the SHARE_KEYS."""

    kept: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)  # each with its `reason` and `max_share`

    def due(self, policy: Policy) -> bool:
        """Whether the cell takes another repeat: fewer kept than asked, and retries left."""
        taken = len(self.kept) + len(self.dropped)
        return len(self.kept) < policy.repeats and taken < policy.repeats + policy.max_retries


def why_busy(figures: dict[str, Any], max_share: float) -> str:
    """'' for a repeat to keep; else why it was busy, e.g. 'others held 52% of the CPU (> 25%)'."""
    held = figures["others_cpu_share"] + figures["steal_share"]
    if held <= max_share:
        return ""
    steal = f", {figures['steal_share']:.0%} of it steal" if figures["steal_share"] >= 0.005 else ""
    return f"others held {held:.0%} of the CPU{steal} (> {max_share:.0%}), load {figures['load_1m']:.1f}"


def share_of(figures: dict[str, Any]) -> dict[str, float]:
    """What the others took during a repeat (the result's `disturbance` entries)."""
    return {k: figures[k] for k in SHARE_KEYS}


def take_rounds(names: list[str], turn: Callable[[str], dict[str, Any] | None], policy: Policy) -> dict[str, Tally]:
    """Takes repeats in rounds until no cell is due; `turn(name)` takes one timed repeat of a
    cell and returns its figures, or None when the cell failed (it takes no more turns)."""
    tallies = {name: Tally() for name in names}
    failed: set[str] = set()
    for round_ in itertools.count():
        due = [n for n in names if n not in failed and tallies[n].due(policy)]
        if not due:
            return tallies
        order = due if round_ % 2 == 0 else due[::-1]
        log.info("round %d: %s", round_ + 1, ", ".join(order))
        for name in order:
            figures = turn(name)
            if figures is None:
                failed.add(name)
                continue
            reason = why_busy(figures, policy.max_share)
            if reason:
                tallies[name].dropped.append({**figures, "reason": reason, "max_share": policy.max_share})
            else:
                tallies[name].kept.append(figures)
    raise AssertionError("unreachable")


def all_dropped(tally: Tally) -> str:
    """The reason of a cell that kept no repeat."""
    worst = max(tally.dropped, key=lambda d: d["others_cpu_share"] + d["steal_share"])
    return (
        f"machine busy: all {len(tally.dropped)} repeats were taken while other processes held the CPU "
        f"(the worst: {worst['reason']}); rerun on an idle machine"
    )


def dropped_summary(dropped: list[dict[str, Any]]) -> str:
    """How a cell's dropped repeats are shown: '2 busy: others held 52%, 61% of the CPU (> 25%)'."""
    if not dropped:
        return ""
    held = ", ".join(f"{d['others_cpu_share'] + d['steal_share']:.0%}" for d in dropped)
    return f"{len(dropped)} busy: others held {held} of the CPU (> {dropped[0]['max_share']:.0%})"
