"""Repeats in rounds, and busy repeats retried or dropped (study.busy), on made-up figures."""

from __future__ import annotations

import pytest

from scalelab.study import busy
from scalelab.study.cell import summarize

POLICY = busy.Policy(repeats=3, max_share=0.25, max_retries=2)


def figures(others: float, repeat_s: float = 1.0, steal: float = 0.0) -> dict:
    return {"repeat_s": repeat_s, "others_cpu_share": others, "steal_share": steal, "load_1m": 1.0}


def test_rounds_take_one_repeat_of_every_cell_and_reverse_their_order():
    order = []
    busy.take_rounds(["a", "b", "c"], lambda n: order.append(n) or figures(0.0), POLICY)
    assert order == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]


def test_a_busy_repeat_is_retried_in_a_later_round_and_dropped_with_its_reason():
    others = {"a": iter([0.0, 0.6, 0.0, 0.0]), "b": iter([0.0, 0.0, 0.0])}
    order = []
    tallies = busy.take_rounds(["a", "b"], lambda n: order.append(n) or figures(next(others[n])), POLICY)
    assert order == ["a", "b", "b", "a", "a", "b", "a"]  # a's busy repeat is made up in round 4
    assert len(tallies["a"].kept) == 3 and len(tallies["b"].kept) == 3
    [dropped] = tallies["a"].dropped
    assert dropped["reason"] == "others held 60% of the CPU (> 25%), load 1.0" and dropped["max_share"] == 0.25
    assert busy.dropped_summary(tallies["a"].dropped) == "1 busy: others held 60% of the CPU (> 25%)"


def test_steal_counts_as_taken_by_others():
    assert busy.why_busy(figures(0.1, steal=0.2), 0.25).startswith("others held 30% of the CPU, 20% of it steal")


def test_retries_are_limited_and_a_cell_busy_throughout_keeps_nothing():
    tallies = busy.take_rounds(["a"], lambda n: figures(0.9), POLICY)
    tally = tallies["a"]
    assert not tally.kept and len(tally.dropped) == POLICY.repeats + POLICY.max_retries
    result = summarize({"timed_steps": 5, "global_batch": 64, "first_step_s": 1.0}, tally)
    assert result["status"] == "invalid" and result["reason"].startswith("machine busy: all 5 repeats")
    assert "samples_per_s" not in result and len(result["dropped"]) == 5


def test_a_failed_cell_takes_no_more_turns_and_the_others_go_on():
    order = []

    def turn(name):
        order.append(name)
        return None if name == "b" else figures(0.0)

    tallies = busy.take_rounds(["a", "b"], turn, POLICY)
    assert order == ["a", "b", "a", "a"] and len(tallies["a"].kept) == 3 and not tallies["b"].kept


def test_summary_keeps_only_the_kept_repeats():
    tally = busy.Tally(kept=[figures(0.0, 2.0), figures(0.1, 1.0)], dropped=[{**figures(0.5, 9.0), "reason": "x"}])
    result = summarize({"timed_steps": 2, "global_batch": 10, "first_step_s": 3.0, "compile": True}, tally)
    assert result["status"] == "ok" and result["repeat_s"] == [2.0, 1.0]
    assert result["samples_per_s"] == [10.0, 20.0] and result["step_time_ms"] == [1000.0, 500.0]
    assert result["compile_s"] == pytest.approx(3.0 - 1.5 / 2)
    assert [d["others_cpu_share"] for d in result["disturbance"]] == [0.0, 0.1] and len(result["dropped"]) == 1
