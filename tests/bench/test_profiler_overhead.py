"""`scalelab bench profiler` on a tiny training: the JSON's shape and the summary line (no speed)."""

import json
import time

from helpers import REPO
from scalelab.bench import stats
from scalelab.cli import main

TINY = [
    "--params",
    str(REPO / "params.yaml"),
    "--repeats",
    "1",
    "--set",
    "train.epochs=1",
    "--set",
    "train.strategy=single",
    "--set",
    "train.nproc_per_node=1",
    "--set",
    "tracking.enabled=false",
]


def test_profiler_benchmark_times_whole_runs_with_the_profiler_on_and_off(workdir, capsys):
    start = time.monotonic()
    assert main(["bench", "profiler", "--out", str(workdir / "bench"), *TINY]) == 0
    elapsed_s = time.monotonic() - start
    assert "profiler overhead:" in capsys.readouterr().out
    result = json.loads((workdir / "bench/profiler_overhead.json").read_text())
    assert result["benchmark"] == "profiler_overhead" and "alternating" in result["method"]
    assert result["train"]["strategy"] == "single" and result["train"]["epochs"] == 1
    on, off = result["runs"]["on"], result["runs"]["off"]
    assert len(on) == len(off) == 1
    assert on[0]["traces"] == 1 and on[0]["trace_bytes"] > 0  # the profiler really ran in `on` ...
    assert off[0]["traces"] == 0  # ... and not in `off`
    assert on[0]["steps"] == off[0]["steps"] > 0
    assert (
        0 < on[0]["wall_s"] and 0 < off[0]["wall_s"] and on[0]["wall_s"] + off[0]["wall_s"] < elapsed_s
    )  # our stopwatch
    assert result["median_ratio"] == on[0]["wall_s"] / off[0]["wall_s"]
    assert result["ci95"][0] <= result["median_ratio"] <= result["ci95"][1]
    assert on[0]["cpu_s"] > 0 and result["cpu_time"]["median_ratio"] == on[0]["cpu_s"] / off[0]["cpu_s"]
    assert result["meets_target"] == (result["median_ratio"] <= 1.05)
    line = stats.read_summary(workdir / "bench")["profiler_overhead"]
    assert line.endswith(": met" if result["meets_target"] else ": not met") and "goal <= 1.05" in line
    assert sorted(p.name for p in (workdir / "bench").iterdir()) == ["profiler_overhead.json", "summary.md"]
