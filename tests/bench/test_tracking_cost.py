"""`scalelab bench tracking` on tiny sizes: the JSON file's shape (not its figures)."""

import json

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
]


def test_tracking_benchmark_writes_its_figures_and_method(workdir, capsys):
    assert main(["bench", "tracking", "--out", str(workdir / "bench"), *TINY]) == 0
    assert "tracking overhead:" in capsys.readouterr().out
    result = json.loads((workdir / "bench/tracking_overhead.json").read_text())
    assert result["benchmark"] == "tracking_overhead" and "interleaved" in result["method"]
    for arm in ("off", "batched", "sync"):
        assert result["median_step_ms"][arm] > 0 and result["mean_step_ms"][arm] > 0
        assert len(result["repeat_median_step_ms"][arm]) == 2
    assert len(result["repeat_overhead_ratios"]) == 2
    assert result["steps_per_repeat"] == {"off": 12, "batched": 12, "sync": 3}
    for key in (
        "overhead_ratio",
        "amortized_overhead_ratio",
        "sync_overhead_ratio",
        "sync_log_metric_ms_median",
        "writer_cpu_ms_per_step",
        "writer_start_s",
        "batched_drain_ms_median",
    ):
        assert isinstance(result[key], float) and result[key] >= 0, key
    assert result["overhead_pct"] == (result["overhead_ratio"] - 1) * 100
    assert result["target_overhead_ratio"] == 1.01 and isinstance(result["meets_target"], bool)
    assert result["workload"]["batch_size"] == 8 and result["workload"]["strategy"] == "single"
    assert not [p for p in (workdir / "bench").iterdir() if p.name != "tracking_overhead.json"]  # store removed
