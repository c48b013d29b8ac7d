"""scalelab.bench.harness: busy repeats retried and dropped as the study's are, the figure's line
saying how many, a figure's verdict from its value against its goal, and `bench all` saying what runs."""

import argparse
import json

import pytest

from scalelab.bench import harness, stats, suite
from scalelab.bench.harness import Goal
from scalelab.runtime import disturbance


def shares(monkeypatch, held):
    """Each repeat's share of the CPU that others held, in the order the repeats are taken."""
    held = iter(held)
    monkeypatch.setattr(disturbance, "share", lambda *a, **k: disturbance.Share(next(held), 0.0, 1.0))


def test_a_busy_repeat_is_retried_and_past_the_retries_dropped(monkeypatch):
    shares(monkeypatch, [0.1, 0.6, 0.7, 0.05, 0.9])  # repeats 1 and 2 busy, then kept, then busy again
    reps = harness.take_repeats(lambda i: f"repeat {i}", {"repeats": 3, "max_share": 0.25, "max_retries": 2})
    assert reps.kept == ["repeat 0", "repeat 3"]  # 5 taken: 3 asked + 2 retries; only 2 quiet ones
    assert [d["others_cpu_share"] for d in reps.dropped] == [0.6, 0.7, 0.9]
    assert all("others held" in d["reason"] for d in reps.dropped)
    assert [d["others_cpu_share"] for d in reps.disturbance] == [0.1, 0.05]


def test_a_machine_busy_through_every_repeat_gives_no_figure(monkeypatch):
    shares(monkeypatch, [0.9, 0.8, 0.7])
    with pytest.raises(harness.MachineBusy, match="all 3 repeats were taken while other processes held the CPU"):
        harness.take_repeats(lambda i: i, {"repeats": 2, "max_share": 0.25, "max_retries": 1})


def test_a_quiet_machine_keeps_exactly_the_repeats_asked_for(monkeypatch):
    shares(monkeypatch, [0.0] * 10)
    reps = harness.take_repeats(lambda i: i, {"repeats": 3, "max_share": 0.25, "max_retries": 3})
    assert reps.kept == [0, 1, 2] and reps.dropped == []


def test_our_processes_include_the_children_a_repeat_ran_and_reaped():
    import os
    import subprocess
    import sys

    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    before = harness._snapshot([os.getpid()])
    subprocess.run([sys.executable, "-c", spin], check=True)  # half a CPU second, then reaped
    after = harness._snapshot([os.getpid()])
    # counted as ours (not as others' load): at least its 0.5 s, in /proc's ticks
    assert after.own_ticks - before.own_ticks >= 0.45 * disturbance.HZ


def bench_args(bench, *argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_figure_says_how_many_busy_repeats_were_dropped(tmp_path, monkeypatch, capsys):
    shares(monkeypatch, [0.5, 0.0, 0.0])

    def measure(ctx):
        reps = harness.take_repeats(lambda i: 1.0 + i, ctx.policy())
        ctx.figure("toy", f"median {stats.median(reps.kept):.1f} s", stats.median(reps.kept), Goal("<=", 2.0))
        ctx.figure("toy_busy", "the same", stats.median(reps.kept), Goal("<=", 2.0), dropped=reps.dropped)
        return {"kept": reps.kept, **reps.json()}

    toy = harness.Benchmark("toy", "toy.json", "A toy.", measure, (harness.opt("--repeats", 2, "repeats"),))
    result = harness.run(toy, bench_args(toy), tmp_path)
    assert result["kept"] == [2.0, 3.0] and len(result["dropped"]) == 1
    assert json.loads((tmp_path / "toy.json").read_text()) == result and result["method"] == "A toy."
    lines = stats.read_summary(tmp_path)
    assert lines["toy"] == "- toy: median 2.5 s; goal <= 2.0: not met"  # 2.5 > 2: not met
    assert lines["toy_busy"].startswith("- toy_busy: the same; 1 busy repeat dropped (1 busy: others held 50% ")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "scalelab bench toy: measuring" and printed[1:3] == [lines["toy"], lines["toy_busy"]]


def test_bench_all_says_which_benchmark_runs_and_prints_each_figure_as_it_lands(tmp_path, monkeypatch, capsys):
    def toy(name):
        measure = lambda ctx: ctx.figure(f"{name}_figure", "1.0", 1.0, Goal("<=", 2.0)) or {}  # noqa: E731
        return harness.Benchmark(name, f"{name}.json", "A toy.", measure)

    monkeypatch.setattr(suite, "MODULES", {"a": "a", "b": "b"})
    monkeypatch.setattr(suite, "benchmark", toy)
    assert suite.run(argparse.Namespace(name="all", out=str(tmp_path))) == 0
    assert capsys.readouterr().out.splitlines() == [
        "[1/2] scalelab bench a",
        "scalelab bench a: measuring",
        "- a_figure: 1.0; goal <= 2.0: met",
        f"scalelab bench a: 1 figures -> {tmp_path / 'a.json'}",
        "[2/2] scalelab bench b",
        "scalelab bench b: measuring",
        "- b_figure: 1.0; goal <= 2.0: met",
        f"scalelab bench b: 1 figures -> {tmp_path / 'b.json'}",
    ]


def test_a_failing_benchmark_writes_its_json_and_then_fails(tmp_path):
    def measure(ctx):
        raise harness.Failed("wrong", {"x": 1})

    bad = harness.Benchmark("bad", "bad.json", "A toy.", measure)
    with pytest.raises(harness.Failed, match="wrong"):
        harness.run(bad, bench_args(bad), tmp_path)
    assert json.loads((tmp_path / "bad.json").read_text())["x"] == 1


def test_each_arm_leads_in_turn_and_two_arms_alternate():
    assert [harness.rotated(["a", "b"], i) for i in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert [harness.rotated("xyz", i)[0] for i in range(4)] == ["x", "y", "z", "x"]
