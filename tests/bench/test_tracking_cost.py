"""`scalelab bench tracking` on tiny sizes: the JSON file's shape (not its figures)."""

import argparse
import json
import statistics

import pytest

from helpers import paired_bootstrap_ci, summary_verdict
from scalelab.bench import harness, stats, tracking_cost
from scalelab.cli import main

TINY = [
    "--steps",
    "12",
    "--sync-steps",
    "3",
    "--repeats",
    "2",
    "--warmup-steps",
    "2",
    "--flush-every",
    "4",
    "--features",
    "8",
    "--hidden",
    "16",
    "--batch-size",
    "8",
    "--target-step-ms",
    "0",
    "--default-log-every",
    "3",
    "--stop-procs",
    "0",
    "--metrics",
    "1",
    "30",
    "--metric-steps",
    "10",
    "--max-busy-share",
    "1.0",  # keep every repeat: xdist workers share the machine (dropping is tested in test_harness)
]
ARMS = ("off", "batched", "off_default", "batched_default", "sync")


def test_tracking_benchmark_writes_its_figures_method_and_summary_lines(workdir, capsys):
    assert main(["bench", "tracking", "--out", str(workdir / "bench"), *TINY]) == 0
    printed = capsys.readouterr().out
    assert "- tracking_in_thread: " in printed and "- tracking_ab_default: " in printed
    result = json.loads((workdir / "bench/tracking_overhead.json").read_text())
    assert result["benchmark"] == "tracking_overhead" and "interleaved" in result["method"]
    for arm in ARMS:
        assert result["median_step_ms"][arm] > 0
        assert len(result["repeat_median_step_ms"][arm]) == 2
    # the overhead: the median over repeats of batched / off, each pair from the same repeat
    reps = result["repeat_median_step_ms"]
    ratios = [b / o for b, o in zip(reps["batched"], reps["off"])]
    assert result["ab"]["log_every_1"]["median_ratio"] == pytest.approx(statistics.median(ratios))
    assert result["steps_per_repeat"] == {"off": 12, "batched": 12, "off_default": 12, "batched_default": 12, "sync": 3}
    # every other figure, recomputed from the raw figures beside it, or > 0 where 0 would mean unmeasured
    assert result["sync_overhead_ratio"] == pytest.approx(
        statistics.median(s / o for s, o in zip(reps["sync"], reps["off"]))
    )
    # one sync step holds 3 synchronous log_metric calls (train_loss, step_time_ms, samples_per_s)
    assert 0 < result["sync_log_metric_ms_median"] < result["median_step_ms"]["sync"]
    writer = {arm: 1000 * sum(result["raw_writer_cpu_s"][arm]) / (12 * 2) for arm in ("batched", "batched_default")}
    assert [len(result["raw_writer_cpu_s"][arm]) for arm in writer] == [2, 2]
    assert result["writer_cpu_ms_per_step_by_arm"] == pytest.approx(writer)
    assert result["writer_start_s"] > 0  # a writer process started and stored a first batch
    drains = result["repeat_batched_drain_ms"]
    assert len(drains) == 2 and min(drains) > 0  # each drain waits for the writer's answer
    assert result["workload"]["batch_size"] == 8 and result["workload"]["strategy"] == "single"
    assert not [p for p in (workdir / "bench").iterdir() if p.name not in ("tracking_overhead.json", "summary.md")]
    # in-thread CPU, the A/B at both cadences with intervals, the StopFlag block, summary lines
    it = result["in_thread"]["batched"]
    assert len(it["repeat_mean_us_per_step"]) == 2 and it["mean_us_per_step"] > 0  # log_metrics always costs some CPU
    assert it["mean_us_per_step"] == pytest.approx(statistics.fmean(it["repeat_mean_us_per_step"]))  # equal repeats
    assert it["fraction_of_off_step"] == pytest.approx(
        it["mean_us_per_step"] / (1000 * result["median_step_ms"]["off"])
    )
    assert result["default_log_every_steps"] == 3
    for cadence, arms in (
        ("log_every_1", ("batched", "off")),
        ("log_every_default", ("batched_default", "off_default")),
    ):
        ab, (arm, ref) = result["ab"][cadence], (reps[arms[0]], reps[arms[1]])
        assert ab["repeat_ratios"] == pytest.approx([a / r for a, r in zip(arm, ref)])
        assert ab["median_ratio"] == pytest.approx(statistics.median(ab["repeat_ratios"]))
        # the interval, recomputed from the raw repeats by the stated method (not the benchmark's code)
        boot = ab["bootstrap"]
        assert boot["unit"] == "repeat (pair)" and boot["resamples"] >= 1000
        assert ab["ci95"] == pytest.approx(list(paired_bootstrap_ci(arm, ref, boot["resamples"], boot["seed"])))
    assert set(result["writer_cpu_ms_per_step_by_arm"]) == {"batched", "batched_default"}
    assert result["stop_flag"] is None  # --stop-procs 0; measured in the test below
    assert result["dropped"] == [] and len(result["disturbance"]) == 2  # every repeat kept, its disturbance noted
    # the tracker's cost with 1 and 30 metrics a step: 30 metrics take more of the thread than 1
    curve = result["metrics_per_step"]
    assert curve["metrics"] == [1, 30] and len(curve["store_s_per_step"]) == 2 and min(curve["store_s_per_step"]) > 0
    assert curve["in_thread_us_per_step"][1] > curve["in_thread_us_per_step"][0] > 0
    lines = stats.read_summary(workdir / "bench")
    assert set(lines) == {"tracking_in_thread", "tracking_ab_every_step", "tracking_ab_default"}
    # each verdict is its figure against its goal, as the line writes both
    fraction = result["in_thread"]["batched"]["fraction_of_off_step"]
    _, text, goal_text, verdict = summary_verdict(lines["tracking_in_thread"])
    assert f" = {100 * fraction:.3f}% of a " in text and goal_text == "<= 1%"
    assert verdict == ("met" if fraction <= 0.01 else "not met")
    low, high = result["ab"]["log_every_default"]["ci95"]
    _, text, goal_text, verdict = summary_verdict(lines["tracking_ab_default"])
    assert f"(95% CI {100 * (low - 1):+.2f}% to {100 * (high - 1):+.2f}%)" in text and goal_text == "95% CI includes 0%"
    assert verdict == ("met" if low <= 1 <= high else "not met")
    assert summary_verdict(lines["tracking_ab_every_step"])[3] == "not measured"  # no goal of its own


def test_stop_flag_cost_runs_two_gloo_ranks_and_reports_its_fraction(tmp_path):
    parser = argparse.ArgumentParser()
    tracking_cost.BENCH.add_arguments(parser)
    args = parser.parse_args(["--stop-steps", "5", "--stop-repeats", "2", "--stop-batch", "4", "--stop-every", "2"])
    args.max_busy_share = 1.0
    sf = tracking_cost.stop_flag_cost(harness.Context(tracking_cost.BENCH, args, tmp_path, tmp_path), [16])
    assert sf["processes"] == 2 and sf["check_every_steps"] == 2 and sf["call_us_median"] > 0
    raw = sf["raw_times_s"]  # rank 0's seconds: arm -> repeat -> step
    assert [len(r) for r in raw["stop_flag"]] == [5, 5] and [len(r) for r in raw["plain"]] == [5, 5]
    # a repeat's figure is its median step; the cost, the median over repeats of stop_flag / plain
    per_repeat = {arm: [statistics.median(r) for r in reps] for arm, reps in raw.items()}
    ratio = statistics.median(s / p for s, p in zip(per_repeat["stop_flag"], per_repeat["plain"]))
    assert sf["ab_ratio"]["median_ratio"] == pytest.approx(ratio)
    assert sf["plain_step_ms_median"] == pytest.approx(1000 * statistics.median(per_repeat["plain"]))
    boot = sf["ab_ratio"]["bootstrap"]  # the interval, recomputed from the raw repeats by the stated method
    expected = paired_bootstrap_ci(per_repeat["stop_flag"], per_repeat["plain"], boot["resamples"], boot["seed"])
    assert sf["ab_ratio"]["ci95"] == pytest.approx(list(expected))
    call_fraction = sf["call_us_median"] / (1000 * sf["plain_step_ms_median"])
    assert sf["cost"] == pytest.approx(max(ratio - 1, call_fraction))
    advice = "raise slurm.stop_check_every_steps"  # the cost shows: more than 1% of the step
    assert sf["note"].startswith("checked every 2 steps") and (advice in sf["note"]) == (sf["cost"] > 0.01)
