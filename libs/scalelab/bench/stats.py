"""Shared figures of the benchmarks: medians, paired ratios with a bootstrap interval, summary.md.

Every benchmark that compares two arms runs them interleaved, one pair per repeat, so that
machine noise hits both alike. Its figure is the median over repeats of the per-repeat ratio
(arm / reference), and its 95% interval comes from resampling whole repeats (pairs) with
replacement, `BOOTSTRAP_RESAMPLES` times, from a fixed seed (scalelab.study.bootstrap, the
study's bootstrap): the same repeats always give the same interval.

`write_summary_line` keeps `<out_dir>/summary.md` with exactly one line per figure:

    - parity_single: engine/plain step time 1.004 (95% CI 0.991-1.013); goal <= 1.02: met
"""

from __future__ import annotations

import os
import socket
import statistics
from collections.abc import Sequence
from pathlib import Path

from scalelab.runtime.io import atomic_write_text
from scalelab.study import bootstrap

BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = bootstrap.RESAMPLES, bootstrap.SEED
SUMMARY_FILE = "summary.md"


def machine() -> dict[str, object]:
    """Where a benchmark ran, for its JSON: cores, the 1-minute load, host and CPU model."""
    from scalelab.tracking import provenance

    return {
        "cpu_cores": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "host": socket.gethostname(),
        "cpu": provenance.cpu_model(),
    }


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence (ValueError when empty)."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def paired_ratios(arm: Sequence[float], reference: Sequence[float]) -> list[float]:
    """arm[i] / reference[i] for each repeat i; the two must pair up (same length)."""
    if len(arm) != len(reference) or not arm:
        raise ValueError(f"paired repeats need equal, non-zero lengths: {len(arm)} and {len(reference)}")
    return [a / r for a, r in zip(arm, reference)]


def median_ratio(arm: Sequence[float], reference: Sequence[float]) -> float:
    """The median over repeats of arm / reference, each pair taken from the same repeat."""
    return median(paired_ratios(arm, reference))


def bootstrap_ci(arm: Sequence[float], reference: Sequence[float]) -> tuple[float, float]:
    """The bootstrap 95% interval of `median_ratio`, resampling whole repeats (pairs): the one
    bootstrap of the study and the benchmarks (scalelab.study.bootstrap), from its fixed seed."""
    paired_ratios(arm, reference)  # refuses unpaired or empty repeats
    return bootstrap.median_paired_ratio(arm, reference)


def ratio_figures(arm: Sequence[float], reference: Sequence[float]) -> dict[str, object]:
    """The JSON block of a paired comparison: ratio, its interval and every repeat's ratio."""
    low, high = bootstrap_ci(arm, reference)
    return {
        "median_ratio": median_ratio(arm, reference),
        "ci95": [low, high],
        "repeat_ratios": paired_ratios(arm, reference),
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED, "unit": "repeat (pair)"},
    }


def status_text(met: bool | None) -> str:
    """'met', 'not met', or 'not measured' (None)."""
    return "not measured" if met is None else ("met" if met else "not met")


def summary_line(name: str, figure_text: str, goal_text: str, met: bool | None) -> str:
    """The one line of summary.md for figure `name`."""
    if not name or any(c in name for c in ":\n") or "\n" in figure_text + goal_text:
        raise ValueError(f"summary line needs a name without ':' and single-line texts: {name!r}")
    return f"- {name}: {figure_text}; goal {goal_text}: {status_text(met)}"


def write_summary_line(out_dir: Path, name: str, figure_text: str, goal_text: str, met: bool | None) -> Path:
    """Puts figure `name`'s line into `<out_dir>/summary.md`, replacing its old line, keeping others.

    Args:
        out_dir: the benchmark output folder (results/bench).
        name: the figure's name, unique across benchmarks (e.g. "parity_ddp").
        figure_text: the measured figure with its units.
        goal_text: the goal, e.g. "<= 1.02".
        met: whether the goal was met; None when it could not be measured.

    Returns:
        The summary file's path.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / SUMMARY_FILE
    line = summary_line(name, figure_text, goal_text, met)
    prefix = f"- {name}: "
    lines = path.read_text().splitlines() if path.exists() else []  # benchmarks run one at a time
    if any(old.startswith(prefix) for old in lines):
        lines = [line if old.startswith(prefix) else old for old in lines]
    else:
        lines.append(line)
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def read_summary(out_dir: Path) -> dict[str, str]:
    """name -> line of `<out_dir>/summary.md` (empty when there is none)."""
    path = Path(out_dir) / SUMMARY_FILE
    lines = path.read_text().splitlines() if path.exists() else []
    return {line[2:].split(":", 1)[0]: line for line in lines if line.startswith("- ")}
