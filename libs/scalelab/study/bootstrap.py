"""The one bootstrap of the study and the benchmarks: percentile 95% intervals over repeats.

`RESAMPLES` resamples with replacement, drawn by numpy's default generator from the fixed `SEED`
(the same repeats always give the same interval); the interval is the 2.5th and 97.5th
percentiles of the resampled statistic (numpy's linear interpolation). What is resampled follows
how the repeats were measured:

- `ratio_of_medians` (the study, report.md): a cell and its baseline ran at different times, so
  their repeats are resampled independently; the statistic is median(cell) / median(base).
- `median_paired_ratio` (the benchmarks' A/B figures): the two arms ran interleaved, one pair per
  repeat, so whole pairs are resampled; the statistic is the median of arm[i] / reference[i].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

RESAMPLES = 2000
SEED = 0
PERCENTILES = (2.5, 97.5)  # a 95% interval


def interval(
    statistic: Callable[..., np.ndarray], *samples: Sequence[float], paired: bool, seed: int = SEED
) -> tuple[float, float]:
    """The percentile bootstrap interval of `statistic` over resampled repeats.

    Args:
        statistic: takes one (RESAMPLES, n) array per sample, returns RESAMPLES values.
        samples: the repeats of each sample.
        paired: resample the same repeat indices in every sample (paired repeats of equal
            length), or each sample on its own (one draw after the other, in order).
        seed: the generator's seed.

    Returns:
        (low, high): the PERCENTILES of the resampled statistic.
    """
    arrays = [np.asarray(s, dtype=float) for s in samples]
    if paired and len({len(a) for a in arrays}) != 1:
        raise ValueError(f"paired repeats need equal lengths: {[len(a) for a in arrays]}")
    rng = np.random.default_rng(seed)
    if paired:
        picks = rng.integers(0, len(arrays[0]), (RESAMPLES, len(arrays[0])))
        drawn = [a[picks] for a in arrays]
    else:
        drawn = [a[rng.integers(0, len(a), (RESAMPLES, len(a)))] for a in arrays]
    low, high = np.percentile(statistic(*drawn), PERCENTILES)
    return float(low), float(high)


def ratio_of_medians(cell: Sequence[float], base: Sequence[float], seed: int = SEED) -> tuple[float, float]:
    """The interval of median(cell) / median(base), the two resampled independently."""
    return interval(lambda c, b: np.median(c, axis=1) / np.median(b, axis=1), cell, base, paired=False, seed=seed)


def median_paired_ratio(arm: Sequence[float], reference: Sequence[float], seed: int = SEED) -> tuple[float, float]:
    """The interval of the median over repeats of arm / reference, whole pairs resampled."""
    return interval(lambda a, r: np.median(a / r, axis=1), arm, reference, paired=True, seed=seed)
