"""scalelab.bench.stats: paired ratios, their bootstrap interval, and summary.md's one line per figure."""

import pytest

from scalelab.bench import stats


def test_median_ratio_pairs_repeats_and_the_interval_brackets_it():
    arm, ref = [1.1, 2.2, 3.3, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.paired_ratios(arm, ref) == pytest.approx([1.1, 1.1, 1.1, 1.0, 1.0])
    assert stats.median_ratio(arm, ref) == pytest.approx(1.1)
    low, high = stats.bootstrap_ci(arm, ref)
    assert 1.0 <= low <= stats.median_ratio(arm, ref) <= high <= 1.1 + 1e-12
    assert stats.bootstrap_ci(arm, ref) == (low, high)  # seeded: the same interval every time
    assert stats.bootstrap_ci([2.0] * 7, [1.0] * 7) == (2.0, 2.0)


def test_unpaired_or_empty_repeats_are_refused():
    with pytest.raises(ValueError):
        stats.median_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        stats.median([])


def test_summary_keeps_one_line_per_figure_replacing_its_own(tmp_path):
    stats.write_summary_line(tmp_path, "a", "1.01", "<= 1.02", True)
    stats.write_summary_line(tmp_path, "b", "3 s", "<= 2 s", False)
    stats.write_summary_line(tmp_path, "c", "-", "<= 5%", None)
    stats.write_summary_line(tmp_path, "a", "1.05", "<= 1.02", False)
    lines = (tmp_path / "summary.md").read_text().splitlines()
    assert lines == [
        "- a: 1.05; goal <= 1.02: not met",
        "- b: 3 s; goal <= 2 s: not met",
        "- c: -; goal <= 5%: not measured",
    ]
    assert list(stats.read_summary(tmp_path)) == ["a", "b", "c"]


def test_a_name_that_would_break_the_line_format_is_refused(tmp_path):
    with pytest.raises(ValueError):
        stats.write_summary_line(tmp_path, "a: b", "x", "y", True)
    with pytest.raises(ValueError):
        stats.write_summary_line(tmp_path, "a", "two\nlines", "y", True)
