"""`scalelab bench scaling` on tiny sizes: the JSON file's shape, the fits and the plot (not speed),
including the two whole-command curves (a real study of 1 and 2 cells, reproduce of 10- and
20-step runs)."""

import json

import pytest

from scalelab.bench import scaling, stats
from scalelab.cli import main

TINY = ["--metrics", "1", "10", "--tracking-steps", "10", "--min-rows", "100", "--max-rows", "1000"]
TINY += ["--min-params", "1000", "--max-params", "10000", "--repeats", "1"]
TINY += ["--cells", "1", "2", "--run-steps", "10", "20"]


@pytest.mark.integration
def test_scaling_benchmark_writes_slopes_verdicts_plot_and_summary(workdir):
    assert main(["bench", "scaling", "--out", "bench", *TINY]) == 0  # relative, as `make bench` passes it
    result = json.loads((workdir / "bench/scaling.json").read_text())
    assert result["benchmark"] == "scaling" and "log(size)" in result["method"]
    curves = result["curves"]
    assert set(curves) == set(scaling.UNITS)
    assert curves["tracking_in_thread_vs_metrics_per_step"]["sizes"] == [1, 10]
    assert curves["prepare_time_vs_csv_rows"]["sizes"] == [100, 1000]
    assert curves["checkpoint_save_vs_parameters"]["sizes"] == [1000, 10000]
    for curve in curves.values():
        assert len(curve["costs"]) == len(curve["sizes"]) and all(c > 0 for c in curve["costs"])
        assert curve["growth"] in ("sub-linear", "linear", "worse than linear")
    assert (workdir / "bench/scaling.png").read_bytes()[:4] == b"\x89PNG"
    lines = stats.read_summary(workdir / "bench")
    assert {f"scaling_{k}" for k in curves} == set(lines) and "not_measured" not in result
    assert curves["study_wall_vs_cells"]["sizes"] == [1, 2]
    assert len(curves["study_wall_vs_cells"]["per_cell_s"]) == 2
    rep = curves["reproduce_vs_run_length"]
    assert rep["sizes"] == [10, 20] and rep["matched"] == [True, True]  # every reproduce matched its run
    assert all(t > 0 for t in rep["train_s"]) and len(rep["fixed_s"]) == 2
    for name in ("study_wall_vs_cells", "reproduce_vs_run_length"):
        assert "log-log slope" in lines[f"scaling_{name}"] and "not measured" not in lines[f"scaling_{name}"]
    assert "= training" in lines["scaling_reproduce_vs_run_length"]
    assert [p.name for p in (workdir / "bench").iterdir() if p.name.startswith(".")] == []  # work folder removed


@pytest.mark.parametrize(
    ("costs", "growth"), [([1, 10, 100], "linear"), ([1, 2, 4], "sub-linear"), ([1, 100, 10000], "worse than linear")]
)
def test_fit_gives_the_log_log_slope_and_its_verdict(costs, growth):
    got = scaling.fit([10, 100, 1000], costs)
    assert got["growth"] == growth and got["linear_or_better"] == (growth != "worse than linear")
    assert got["slope"] == pytest.approx(
        {"linear": 1.0, "sub-linear": 0.30103, "worse than linear": 2.0}[growth], rel=1e-4
    )


def test_decades_run_from_low_to_high_inclusive():
    assert scaling.decades(1000, 100_000) == [1000, 10_000, 100_000] and scaling.decades(5, 9) == [5]
