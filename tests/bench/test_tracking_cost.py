"""`scalelab bench tracking` on tiny sizes: the JSON file's shape (not its figures)."""

import json
import statistics

import pytest

from scalelab.bench import stats, stopflag_cost
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
]
ARMS = ("off", "batched", "off_default", "batched_default", "sync")


def test_tracking_benchmark_writes_its_figures_method_and_summary_lines(workdir, capsys):
    assert main(["bench", "tracking", "--out", str(workdir / "bench"), *TINY]) == 0
    assert "tracking overhead:" in capsys.readouterr().out
    result = json.loads((workdir / "bench/tracking_overhead.json").read_text())
    assert result["benchmark"] == "tracking_overhead" and "interleaved" in result["method"]
    for arm in ARMS:
        assert result["median_step_ms"][arm] > 0 and result["mean_step_ms"][arm] > 0
        assert len(result["repeat_median_step_ms"][arm]) == 2
    # the overhead: the median over repeats of batched / off, each pair from the same repeat
    reps = result["repeat_median_step_ms"]
    ratios = [b / o for b, o in zip(reps["batched"], reps["off"])]
    assert result["repeat_overhead_ratios"] == pytest.approx(ratios)
    assert result["overhead_ratio"] == pytest.approx(statistics.median(ratios))
    assert result["overhead_pct"] == pytest.approx(100 * (statistics.median(ratios) - 1))
    assert result["meets_target"] == (statistics.median(ratios) <= 1.01) and result["target_overhead_ratio"] == 1.01
    assert result["steps_per_repeat"] == {"off": 12, "batched": 12, "off_default": 12, "batched_default": 12, "sync": 3}
    for key in (
        "overhead_ratio",
        "amortized_overhead_ratio",
        "sync_overhead_ratio",
        "sync_log_metric_ms_median",
        "writer_cpu_ms_per_step",
        "writer_start_s",
        "batched_drain_ms_median",
        "in_thread_fraction_log_every_1",
    ):
        assert isinstance(result[key], float) and result[key] >= 0, key
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
        assert ab["ci95"][0] <= ab["median_ratio"] <= ab["ci95"][1]
    assert set(result["writer_cpu_ms_per_step_by_arm"]) == {"batched", "batched_default"}
    assert result["stop_flag"] is None  # --stop-procs 0; measured in the test below
    lines = stats.read_summary(workdir / "bench")
    assert set(lines) == {"tracking_in_thread", "tracking_ab_every_step", "tracking_ab_default"}
    assert lines["tracking_in_thread"].endswith(": met" if result["meets_in_thread_target"] else ": not met")


def test_stop_flag_cost_runs_two_gloo_ranks_and_reports_its_fraction(tmp_path):
    sf = stopflag_cost.measure(procs=2, steps=5, repeats=2, batch=4, hidden=[16], work=tmp_path, every=2)
    assert sf["processes"] == 2 and sf["check_every_steps"] == 2 and sf["call_us_median"] > 0
    raw = sf["raw_times_s"]  # rank 0's seconds: arm -> repeat -> step
    assert [len(r) for r in raw["stop_flag"]] == [5, 5] and [len(r) for r in raw["plain"]] == [5, 5]
    # a repeat's figure is its median step; the cost, the median over repeats of stop_flag / plain
    per_repeat = {arm: [statistics.median(r) for r in reps] for arm, reps in raw.items()}
    ratio = statistics.median(s / p for s, p in zip(per_repeat["stop_flag"], per_repeat["plain"]))
    assert sf["ab_ratio"]["median_ratio"] == pytest.approx(ratio) and sf["cost_fraction_of_step"] == pytest.approx(
        ratio - 1
    )
    assert sf["plain_step_ms_median"] == pytest.approx(1000 * statistics.median(per_repeat["plain"]))
    low, high = sf["ab_ratio"]["ci95"]
    assert low <= ratio <= high
    call_fraction = sf["call_us_median"] / (1000 * sf["plain_step_ms_median"])
    assert sf["shows"] == (ratio - 1 > 0.01 or call_fraction > 0.01)
    advice = "raise slurm.stop_check_every_steps"
    assert sf["note"].startswith("checked every 2 steps") and (advice in sf["note"]) == sf["shows"]
