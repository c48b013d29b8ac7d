"""study.bootstrap, the one bootstrap of the study and the benchmarks: expected intervals come from
the distributions of small cases worked out by hand, not from the code."""

import numpy as np
import pytest

from scalelab.study import bootstrap


def test_paired_ratios_of_a_known_case_give_their_tails():
    # ratios 0.9, 1.0, 1.1: the median of 3 draws is 0.9 (or 1.1) with probability 7/27 each,
    # far more than the 2.5% in each tail, so the interval is exactly [0.9, 1.1]
    assert bootstrap.median_paired_ratio([0.9, 1.0, 1.1], [1.0, 1.0, 1.0]) == pytest.approx((0.9, 1.1))


def test_paired_repeats_keep_their_pairs_where_independent_resamples_would_not():
    ref = [1.0, 2.0, 4.0, 8.0, 16.0]  # a load that moves both arms alike, repeat by repeat
    arm = [1.1 * r for r in ref]
    low, high = bootstrap.median_paired_ratio(arm, ref)
    assert low == pytest.approx(1.1) and high == pytest.approx(1.1)  # every pair says 1.1
    low, high = bootstrap.ratio_of_medians(arm, ref)  # unpaired: medians 1..17.6 over 1..16
    assert low < 0.5 and high > 2.0


def test_the_same_repeats_give_the_same_interval_and_another_seed_another():
    cell, base = np.linspace(1000, 1300, 101), np.linspace(900, 1000, 101)  # fine-grained: draws differ
    assert bootstrap.ratio_of_medians(cell, base) == bootstrap.ratio_of_medians(cell, base)
    assert bootstrap.ratio_of_medians(cell, base, seed=1) != bootstrap.ratio_of_medians(cell, base)


def test_paired_samples_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="equal lengths"):
        bootstrap.median_paired_ratio([1.0, 2.0], [1.0])
