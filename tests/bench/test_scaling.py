"""`scalelab bench scaling` on tiny sizes: the JSON file's shape, the fits and the plot (not speed).

The whole-file test runs the in-process curves for real and gives the two whole-command curves
known figures. Those two run for real once, at one size each, in one test sharing one MLflow
store as the benchmark does: a study of 1 cell, and `reproduce` of a 10-step run. That a study of
N cells is N distinct cells is checked on its plan; the slope of a curve is `fit`'s (below)."""

import csv
import json
import math

import pytest

from scalelab.bench import scaling, scaling_runs, stats
from scalelab.cli import main
from scalelab.config import parse_params
from scalelab.launch.shape import local_capacity
from scalelab.study.plan import plan

TINY = ["--metrics", "1", "10", "--tracking-steps", "10", "--min-rows", "100", "--max-rows", "1000"]
TINY += ["--min-params", "1000", "--max-params", "10000", "--repeats", "1"]
TINY += ["--cells", "1", "2", "--run-steps", "10", "20"]


def known_study(cells, work):
    return {"wall_s": [2.0 * n for n in cells], "per_cell_s": [2.0 for _ in cells]}  # 2 s a cell: linear


def known_reproduce(run_steps, work):
    train_s = [s / 10 for s in run_steps]  # 1 s and 2 s of training, plus a fixed 10 s
    return {"reproduce_s": [t + 10 for t in train_s], "train_s": train_s, "steps": run_steps, "matched": [True, True]}


def test_scaling_benchmark_writes_slopes_verdicts_plot_and_summary(workdir, monkeypatch):
    monkeypatch.setattr(scaling_runs, "study_costs", known_study)
    monkeypatch.setattr(scaling_runs, "reproduce_costs", known_reproduce)
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
    study = curves["study_wall_vs_cells"]
    assert study["sizes"] == [1, 2] and study["costs"] == [2.0, 4.0] and study["per_cell_s"] == [2.0, 2.0]
    assert study["slope"] == pytest.approx(1.0) and study["growth"] == "linear"
    rep = curves["reproduce_vs_run_length"]
    assert rep["sizes"] == [10, 20] and rep["costs"] == [11.0, 12.0] and rep["fixed_s"] == [10.0, 10.0]
    assert rep["slope"] == pytest.approx(math.log(12 / 11) / math.log(2)) and rep["train_slope"] == pytest.approx(1.0)
    assert rep["note"] == "reproduce 12.0 s = training 2.0 s + 10.0 s at 20 steps"
    assert (workdir / "bench/scaling.png").read_bytes()[:4] == b"\x89PNG"
    lines = stats.read_summary(workdir / "bench")
    assert {f"scaling_{k}" for k in curves} == set(lines) and "not_measured" not in result
    for name, curve in curves.items():
        assert f"log-log slope {curve['slope']:.2f}" in lines[f"scaling_{name}"]
        assert lines[f"scaling_{name}"].endswith(": met" if curve["slope"] <= 1.1 else ": not met")
    assert lines["scaling_reproduce_vs_run_length"].endswith(
        f"; {rep['note']}; goal linear or better (slope <= 1.1): met"
    )
    assert [p.name for p in (workdir / "bench").iterdir() if p.name.startswith(".")] == []  # work folder removed


def test_a_study_of_n_cells_plans_n_distinct_runnable_cells():
    cells = plan(parse_params(scaling_runs.study_params(4), "params").speedup, local_capacity())
    assert [c.name for c in cells] == ["ddp-w1", "ddp-w1-b65", "ddp-w1-b66", "ddp-w1-b67"]
    assert not [c for c in cells if c.skipped]


@pytest.mark.integration
def test_the_whole_command_curves_time_a_real_study_and_a_real_reproduce(tmp_path):
    study = scaling_runs.study_costs([1], tmp_path)  # raises unless the study measured exactly 1 cell
    assert study["wall_s"][0] > 0 and study["per_cell_s"] == study["wall_s"]
    with (tmp_path / "study-1/out/speedup.csv").open() as f:  # the study's own table: the cell ran
        assert [(row["name"], row["status"]) for row in csv.DictReader(f)] == [("ddp-w1", "ok")]
    rep = scaling_runs.reproduce_costs([10], tmp_path)  # the same MLflow store, as in the benchmark
    assert rep["steps"] == [10] and rep["matched"] == [True]  # the run planned 10 steps; reproduce matched
    assert 0 < rep["train_s"][0] and 0 < rep["reproduce_s"][0]


def test_run_lengths_that_are_not_whole_epochs_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match=r"--run-steps \[15\]: each must be a multiple of 10"):
        scaling_runs.reproduce_costs([15, 20], tmp_path)
    assert list(tmp_path.iterdir()) == []


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
