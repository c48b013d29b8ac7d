"""scalelab.bench.stats: paired ratios, their bootstrap interval, goals and their verdicts, and
summary.md's one line per figure."""

import math

import pytest

from scalelab.bench import stats
from scalelab.bench.stats import Goal


def test_median_ratio_pairs_repeats_and_the_interval_brackets_it():
    arm, ref = [1.1, 2.2, 3.3, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.paired_ratios(arm, ref) == pytest.approx([1.1, 1.1, 1.1, 1.0, 1.0])
    assert stats.median_ratio(arm, ref) == pytest.approx(1.1)
    figures = stats.ratio_figures(arm, ref)
    low, high = figures["ci95"]
    assert figures["median_ratio"] == stats.median_ratio(arm, ref)
    assert figures["repeat_ratios"] == stats.paired_ratios(arm, ref)
    assert 1.0 <= low <= stats.median_ratio(arm, ref) <= high <= 1.1 + 1e-12
    assert stats.ratio_figures(arm, ref)["ci95"] == [low, high]  # seeded: the same interval every time
    assert stats.ratio_figures([2.0] * 7, [1.0] * 7)["ci95"] == [2.0, 2.0]


def test_unpaired_or_empty_repeats_are_refused():
    with pytest.raises(ValueError):
        stats.median_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        stats.ratio_figures([], [])
    with pytest.raises(ValueError):
        stats.median([])


@pytest.mark.parametrize(
    ("goal", "value", "met"),
    [
        (Goal("<=", 1.01), 1.01, True),
        (Goal("<=", 1.01), 1.0101, False),
        (Goal("<", 0.1), 0.1, False),
        (Goal(">=", 0.3), 0.29, False),
        (Goal(">=", 0.3), 0.31, True),
        (Goal("contains", 1.0), (0.9, 1.2), True),
        (Goal("contains", 1.0), (1.01, 1.2), False),
        (Goal("is", True), False, False),
        (Goal("<=", 1.01), None, None),
        (Goal("<=", 1.01), math.nan, None),
        (Goal("none"), 5.0, None),
    ],
)
def test_the_verdict_is_the_value_against_the_goal(goal, value, met):
    assert goal.met(value) is met


def test_a_further_condition_can_only_turn_met_into_not_met():
    assert Goal("<=", 1.01).met(1.0, also=False) is False and Goal("<=", 1.01).met(2.0, also=True) is False
    assert Goal("<=", 1.01).met(None, also=False) is None


def test_summary_keeps_one_line_per_figure_replacing_its_own(tmp_path):
    stats.write_figure(tmp_path, "a", "1.01", 1.01, Goal("<=", 1.02))
    stats.write_figure(tmp_path, "b", "3 s", 3.0, Goal("<=", 2.0, "<= 2 s"))
    stats.write_figure(tmp_path, "c", "-", None, Goal("<=", 0.05, "<= 5%"))
    stats.write_figure(tmp_path, "a", "1.05", 1.05, Goal("<=", 1.02))
    lines = (tmp_path / "summary.md").read_text().splitlines()
    assert lines == [
        "- a: 1.05; goal <= 1.02: not met",
        "- b: 3 s; goal <= 2 s: not met",
        "- c: -; goal <= 5%: not measured",
    ]
    assert list(stats.read_summary(tmp_path)) == ["a", "b", "c"]


def test_a_name_that_would_break_the_line_format_is_refused(tmp_path):
    with pytest.raises(ValueError):
        stats.write_figure(tmp_path, "a: b", "x", 1.0, Goal("<=", 2.0))
    with pytest.raises(ValueError):
        stats.write_figure(tmp_path, "a", "two\nlines", 1.0, Goal("<=", 2.0))
