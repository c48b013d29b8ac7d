"""The benchmarks' figures: medians, paired ratios with the study's bootstrap 95% interval, and
summary.md: one line per figure with its goal and a verdict computed from the value, e.g.
`- parity_single: ... 1.004 (95% CI 0.991-1.013); goal <= 1.01: met`."""

from __future__ import annotations

import math
import operator
import os
import socket
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab.runtime.io import atomic_write_text
from scalelab.study import bootstrap

SUMMARY_FILE = "summary.md"
OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, "is": operator.eq}


@dataclass(frozen=True)
class Goal:
    """`value OP target`; "contains": the value is an interval holding the target; "none": no goal."""

    op: str
    target: Any = None
    text: str = ""  # how summary.md writes it; default "OP TARGET"

    def __str__(self) -> str:
        return self.text or f"{self.op} {self.target}"

    def met(self, value: Any, also: bool = True) -> bool | None:
        """None (not measured) without a value or a goal; else the comparison, and `also`."""
        if self.op == "none" or value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        if self.op == "contains":
            return bool(value[0] <= self.target <= value[1] and also)
        return bool(OPS[self.op](value, self.target) and also)


def machine() -> dict[str, object]:
    """Where a benchmark ran: cores, the 1-minute load, host and CPU model."""
    from scalelab.tracking import provenance

    cpu = provenance.cpu_model()
    return {"cpu_cores": os.cpu_count(), "loadavg_1m": os.getloadavg()[0], "host": socket.gethostname(), "cpu": cpu}


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))  # no values: statistics.StatisticsError, a ValueError


def paired_ratios(arm: Sequence[float], reference: Sequence[float]) -> list[float]:
    """arm[i] / reference[i] for each repeat i (equal, non-zero lengths)."""
    if len(arm) != len(reference) or not arm:
        raise ValueError(f"paired repeats need equal, non-zero lengths: {len(arm)} and {len(reference)}")
    return [a / r for a, r in zip(arm, reference)]


def median_ratio(arm: Sequence[float], reference: Sequence[float]) -> float:
    return median(paired_ratios(arm, reference))


def ratio_figures(arm: Sequence[float], reference: Sequence[float]) -> dict[str, object]:
    """The JSON block of a paired comparison: the median ratio, its bootstrap 95% interval (whole
    repeats, i.e. pairs, resampled) and every repeat's ratio."""
    ratios = paired_ratios(arm, reference)
    return {
        "median_ratio": median(ratios),
        "ci95": list(bootstrap.median_paired_ratio(arm, reference)),
        "repeat_ratios": ratios,
        "bootstrap": {"resamples": bootstrap.RESAMPLES, "seed": bootstrap.SEED, "unit": "repeat (pair)"},
    }


def ratio_text(ratio: dict[str, Any], digits: int = 3, pct: bool = False, inner: str = "") -> str:
    """`1.004 (95% CI 0.991-1.013{inner})`; with `pct`, `+0.40% (95% CI -0.90% to +1.30%)`."""
    (low, high), med = ratio["ci95"], ratio["median_ratio"]
    if pct:
        return f"{100 * (med - 1):+.2f}% (95% CI {100 * (low - 1):+.2f}% to {100 * (high - 1):+.2f}%{inner})"
    return f"{med:.{digits}f} (95% CI {low:.{digits}f}-{high:.{digits}f}{inner})"


def write_figure(out_dir: Path, name: str, text: str, value: Any, goal: Goal, also: bool = True) -> str:
    """Puts figure `name`'s line (verdict `goal.met(value, also)`) into `<out_dir>/summary.md`,
    replacing its old line and keeping the others; returns the line."""
    if not name or any(c in name for c in ":\n") or "\n" in text + str(goal):
        raise ValueError(f"summary line needs a name without ':' and single-line texts: {name!r}")
    met = goal.met(value, also)
    line = f"- {name}: {text}; goal {goal}: {'not measured' if met is None else 'met' if met else 'not met'}"
    figures = read_summary(out_dir)  # benchmarks run one at a time
    figures[name] = line  # in its old line's place, else last
    atomic_write_text(Path(out_dir) / SUMMARY_FILE, "\n".join(figures.values()) + "\n")
    return line


def read_summary(out_dir: Path) -> dict[str, str]:
    """name -> line of `<out_dir>/summary.md` (empty when there is none)."""
    path = Path(out_dir) / SUMMARY_FILE
    lines = path.read_text().splitlines() if path.exists() else []
    return {line[2:].split(":", 1)[0]: line for line in lines if line.startswith("- ")}
