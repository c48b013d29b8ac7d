"""`scalelab bench scaling` on tiny sizes: the JSON file's shape, the fits and the plot (not speed).

The whole-file test gives the other benchmarks' curves and the two whole-command curves known
figures. Those two run for real once, at one size each, in one test sharing one MLflow
store as the benchmark does: a study of 1 cell, and `reproduce` of a 10-step run. That a study of
N cells is N distinct cells is checked on its plan; the slope of a curve is `fit`'s (below)."""

import csv
import json
import math
import subprocess

import pytest
import yaml

from scalelab.bench import harness, scaling, stats
from scalelab.cli import main
from scalelab.config import parse_params
from scalelab.launch.shape import local_capacity
from scalelab.runtime import disturbance
from scalelab.study.plan import plan

TINY = ["--cells", "1", "2", "--run-steps", "10", "20"]
QUIET = {"repeats": 1, "max_share": 1.0, "max_retries": 0}  # every try kept: xdist workers share the machine


def known_study(cells, work, policy):
    assert policy == {"repeats": 1, "max_share": 0.25, "max_retries": 3}  # the harness's busy-repeat defaults
    return {"wall_s": [2.0 * n for n in cells], "per_cell_s": [2.0 for _ in cells], "dropped": []}  # 2 s a cell


def known_reproduce(run_steps, work, policy):
    train_s = [s / 10 for s in run_steps]  # 1 s and 2 s of training, plus a fixed 10 s
    reproduce_s = [t + 10 for t in train_s]
    return {"reproduce_s": reproduce_s, "train_s": train_s, "steps": run_steps, "matched": [True, True], "dropped": []}


def others_figures(out):
    """What `bench tracking`, `bench data` and `bench checkpoint` write: the curves scaling fits."""
    out.mkdir()
    curve = {"metrics": [1, 10, 100], "in_thread_us_per_step": [10.0, 20.0, 40.0], "store_s_per_step": [1, 10, 100]}
    (out / "tracking_overhead.json").write_text(json.dumps({"metrics_per_step": curve}))
    rows = {
        "rows": [100, 1000],
        "prepare_s": [0.1, 1.0],
        "prepare_peak_mb": [50, 60],
        "prepare_peak_above_start_mb": [1, 10],
    }
    (out / "data.json").write_text(json.dumps({"csv_rows": rows}))
    ckpt = [{"strategy": s, "world_size": w, "parameters": p, "save_s": p / 1e4 * k, "load_s": p / 1e5 * k}
            for s, k in (("ddp", 1), ("fsdp", 7)) for w in (1, 2) for p in (1000, 10_000, 100_000)]  # fmt: skip
    ckpt[2]["save_s"] = 1000.0  # 100x at 10x the parameters, from 10 to 1000: slope 1.5 over the decades
    (out / "checkpoint.json").write_text(json.dumps({"rows": ckpt}))


def test_scaling_fits_the_others_curves_and_its_own_and_writes_verdicts_plot_and_summary(workdir, monkeypatch):
    monkeypatch.setattr(scaling, "study_costs", known_study)
    monkeypatch.setattr(scaling, "reproduce_costs", known_reproduce)
    others_figures(workdir / "bench")
    assert main(["bench", "scaling", "--out", "bench", *TINY]) == 0  # relative, as `make bench` passes it
    result = json.loads((workdir / "bench/scaling.json").read_text())
    assert result["benchmark"] == "scaling" and "log(size)" in result["method"]
    curves = result["curves"]
    assert set(curves) == set(scaling.UNITS)
    # each from its own benchmark's file: tracking's metric counts, data's CSV rows, checkpoint's ddp rows at 1 rank
    assert curves["tracking_in_thread_vs_metrics_per_step"]["sizes"] == [1, 10, 100]
    assert curves["tracking_in_thread_vs_metrics_per_step"]["slope"] == pytest.approx(math.log10(2))
    assert curves["tracking_store_vs_metrics_per_step"]["slope"] == pytest.approx(1.0)
    assert curves["prepare_time_vs_csv_rows"]["sizes"] == [100, 1000]
    assert curves["prepare_peak_memory_vs_csv_rows"]["peak_rss_mb"] == [50, 60]
    save = curves["checkpoint_save_vs_parameters"]
    assert save["sizes"] == [1000, 10_000, 100_000] and save["costs"] == [0.1, 1.0, 1000.0]
    assert save["slope"] == pytest.approx(2.0) and save["growth"] == "worse than linear"
    assert curves["checkpoint_load_vs_parameters"]["costs"] == [0.01, 0.1, 1.0]  # the ddp rows, not fsdp's
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
    assert {f"scaling_{k}" for k in curves} == set(lines)
    for name, curve in curves.items():
        assert f"log-log slope {curve['slope']:.2f}" in lines[f"scaling_{name}"]
        assert lines[f"scaling_{name}"].endswith(": met" if curve["slope"] <= 1.1 else ": not met")
    assert lines["scaling_checkpoint_save_vs_parameters"].endswith(": not met")
    assert lines["scaling_reproduce_vs_run_length"].endswith(
        f"; {rep['note']}; 0 busy repeats dropped; goal linear or better (slope <= 1.1): met"
    )
    assert "busy" not in lines["scaling_prepare_time_vs_csv_rows"]  # read from data.json: its own figure says it
    assert [p.name for p in (workdir / "bench").iterdir() if p.name.startswith(".")] == []  # work folder removed


def test_a_curve_whose_benchmark_did_not_run_is_not_measured(workdir, monkeypatch):
    monkeypatch.setattr(scaling, "study_costs", known_study)
    monkeypatch.setattr(scaling, "reproduce_costs", known_reproduce)
    assert main(["bench", "scaling", "--out", "bench", *TINY]) == 0
    result = json.loads((workdir / "bench/scaling.json").read_text())
    assert set(result["curves"]) == {"study_wall_vs_cells", "reproduce_vs_run_length"}
    lines = stats.read_summary(workdir / "bench")
    assert "run `scalelab bench checkpoint` into this folder first" in lines["scaling_checkpoint_save_vs_parameters"]
    assert lines["scaling_tracking_in_thread_vs_metrics_per_step"].endswith(": not measured")
    assert lines["scaling_prepare_time_vs_csv_rows"].endswith(": not measured")


def test_a_study_busy_through_every_try_withholds_its_curve_and_keeps_the_others(workdir, monkeypatch):
    def busy_study(cells, work, policy):
        raise harness.MachineBusy("machine busy: all 4 repeats were taken while other processes held the CPU")

    monkeypatch.setattr(scaling, "study_costs", busy_study)
    monkeypatch.setattr(scaling, "reproduce_costs", known_reproduce)
    others_figures(workdir / "bench")
    assert main(["bench", "scaling", "--out", "bench", *TINY]) == 0
    curves = json.loads((workdir / "bench/scaling.json").read_text())["curves"]
    assert set(curves) == set(scaling.UNITS) - {"study_wall_vs_cells"}  # read from files, and reproduce's
    lines = stats.read_summary(workdir / "bench")
    assert "not measured: machine busy: all 4 repeats" in lines["scaling_study_wall_vs_cells"]
    assert lines["scaling_study_wall_vs_cells"].endswith(": not measured")
    assert lines["scaling_checkpoint_save_vs_parameters"].endswith(": not met")  # written all the same


def test_a_busy_study_is_retried_in_a_fresh_folder_and_its_drop_counted(tmp_path, monkeypatch):
    held = iter([0.9, 0.0, 0.0])  # the 1-cell study's first try busy: others held 90% of the CPU
    monkeypatch.setattr(disturbance, "share", lambda *a, **k: disturbance.Share(next(held), 0.0, 1.0))
    ran = []

    def fake_scalelab(*args, cwd, env):
        ran.append(cwd.name)
        cells = len(yaml.safe_load((cwd / "params.yaml").read_text())["speedup"]["batch_sizes"])
        return subprocess.CompletedProcess(args, 0, "", "measuring \n" * cells)

    monkeypatch.setattr(scaling.pipeline, "scalelab", fake_scalelab)
    got = scaling.study_costs([1, 2], tmp_path, {"repeats": 1, "max_share": 0.25, "max_retries": 1})
    assert ran == ["study-1-0", "study-1-1", "study-2-0"] and len(got["wall_s"]) == 2
    assert [d["others_cpu_share"] for d in got["dropped"]] == [0.9]


def test_a_study_of_n_cells_plans_n_distinct_runnable_cells():
    cells = plan(parse_params(scaling.study_params(4), "params").speedup, local_capacity())
    assert [c.name for c in cells] == ["ddp-w1", "ddp-w1-b65", "ddp-w1-b66", "ddp-w1-b67"]
    assert not [c for c in cells if c.skipped]


@pytest.mark.integration
def test_the_whole_command_curves_time_a_real_study_and_a_real_reproduce(tmp_path):
    study = scaling.study_costs([1], tmp_path, QUIET)  # raises unless the study measured exactly 1 cell
    assert study["wall_s"][0] > 0 and study["per_cell_s"] == study["wall_s"] and study["dropped"] == []
    with (tmp_path / "study-1-0/out/speedup.csv").open() as f:  # the study's own table: the cell ran
        assert [(row["name"], row["status"]) for row in csv.DictReader(f)] == [("ddp-w1", "ok")]
    rep = scaling.reproduce_costs([10], tmp_path, QUIET)  # the same MLflow store, as in the benchmark
    assert rep["steps"] == [10] and rep["matched"] == [True]  # the run planned 10 steps; reproduce matched
    assert 0 < rep["train_s"][0] and 0 < rep["reproduce_s"][0]


def test_run_lengths_that_are_not_whole_epochs_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match=r"--run-steps \[15\]: each must be a multiple of 10"):
        scaling.reproduce_costs([15, 20], tmp_path, QUIET)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("costs", "growth"), [([1, 10, 100], "linear"), ([1, 2, 4], "sub-linear"), ([1, 100, 10000], "worse than linear")]
)
def test_fit_gives_the_log_log_slope_and_its_verdict(costs, growth):
    got = scaling.fit([10, 100, 1000], costs)
    assert got["growth"] == growth and got["local_slopes"] == pytest.approx([got["slope"]] * 2)
    assert got["slope"] == pytest.approx(
        {"linear": 1.0, "sub-linear": 0.30103, "worse than linear": 2.0}[growth], rel=1e-4
    )
