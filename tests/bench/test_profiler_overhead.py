"""`scalelab bench profiler` on a tiny training: the JSON's shape and the summary line (no speed)."""

import json
import statistics
import time

import pytest

from helpers import REPO, paired_bootstrap_ci, summary_verdict
from scalelab.bench import stats
from scalelab.cli import main

TINY = [
    "--params",
    str(REPO / "params.yaml"),
    "--repeats",
    "2",
    "--set",
    "train.epochs=1",
    "--set",
    "train.strategy=single",
    "--set",
    "train.nproc_per_node=1",
    "--set",
    "tracking.enabled=false",
    "--max-busy-share",
    "1.0",  # keep every repeat: xdist workers share the machine (dropping is tested in test_harness)
]


def test_profiler_benchmark_times_whole_runs_with_the_profiler_on_and_off(workdir, capsys):
    start = time.monotonic()
    assert main(["bench", "profiler", "--out", str(workdir / "bench"), *TINY]) == 0
    elapsed_s = time.monotonic() - start
    assert "- profiler_overhead: whole-run wall time profile on/off " in capsys.readouterr().out
    result = json.loads((workdir / "bench/profiler_overhead.json").read_text())
    assert result["benchmark"] == "profiler_overhead" and "alternating" in result["method"]
    assert result["train"]["strategy"] == "single" and result["train"]["epochs"] == 1
    on, off = result["runs"]["on"], result["runs"]["off"]
    assert len(on) == len(off) == 2
    assert all(r["traces"] == 1 and r["trace_bytes"] > 0 for r in on)  # the profiler really ran in `on` ...
    assert all(r["traces"] == 0 for r in off)  # ... and not in `off`
    assert len({r["steps"] for r in on + off}) == 1 and on[0]["steps"] > 0
    wall = {arm: [r["wall_s"] for r in runs] for arm, runs in (("on", on), ("off", off))}
    assert min(wall["on"] + wall["off"]) > 0 and sum(wall["on"] + wall["off"]) < elapsed_s  # our stopwatch
    ratio = statistics.median(a / b for a, b in zip(wall["on"], wall["off"]))
    assert result["median_ratio"] == pytest.approx(ratio)
    # the intervals, recomputed from the raw repeats by the stated method: two repeats whose ratios
    # differ give a real interval (their lowest and highest ratio), not [r, r]
    boot = result["bootstrap"]
    assert boot["unit"] == "repeat (pair)" and boot["resamples"] >= 1000
    low, high = paired_bootstrap_ci(wall["on"], wall["off"], boot["resamples"], boot["seed"])
    assert result["ci95"] == pytest.approx([low, high]) and low < high
    assert result["dropped"] == [] and len(result["disturbance"]) == 2
    cpu = {arm: [r["cpu_s"] for r in runs] for arm, runs in (("on", on), ("off", off))}
    assert min(cpu["on"] + cpu["off"]) > 0
    assert result["cpu_time"]["median_ratio"] == pytest.approx(
        statistics.median(a / b for a, b in zip(cpu["on"], cpu["off"]))
    )
    assert result["cpu_time"]["ci95"] == pytest.approx(
        list(paired_bootstrap_ci(cpu["on"], cpu["off"], boot["resamples"], boot["seed"]))
    )
    # the verdict: the figure against the goal, as the summary line writes both
    _, text, goal, verdict = summary_verdict(stats.read_summary(workdir / "bench")["profiler_overhead"])
    assert text.startswith(f"whole-run wall time profile on/off {result['median_ratio']:.3f} (95% CI ")
    assert goal == "<= 1.05" and verdict == ("met" if ratio <= 1.05 else "not met")
    assert sorted(p.name for p in (workdir / "bench").iterdir()) == ["profiler_overhead.json", "summary.md"]
