"""`scalelab bench startup` on a tiny run: the phases, the largest fixed cost and the side-by-side
comparison with an earlier commit's figures (not their speed)."""

import json
import time

import pytest

from helpers import REPO, summary_verdict
from scalelab.bench import startup, stats
from scalelab.cli import main
from scalelab.runtime import timings


def test_startup_benchmark_times_every_phase_of_a_real_train_run(workdir):
    out = workdir / "bench"
    out.mkdir()
    earlier = {"commit": "0" * 40, "median_s": {"fixed": 1e-3}}  # an earlier commit's figures
    (out / "startup.json").write_text(json.dumps({"current": earlier, "previous": None}))
    args = ["bench", "startup", "--out", str(out), "--params", str(REPO / "params.yaml"), "--repeats", "1"]
    args += ["--epochs", "1", "--strategy", "single", "--no-tracking", "--max-busy-share", "1"]  # the quickest run
    start = time.monotonic()
    assert main(args) == 0
    elapsed_s = time.monotonic() - start
    result = json.loads((out / "startup.json").read_text())
    assert result["benchmark"] == "startup" and "SCALELAB_TIMINGS" in result["method"]
    med = result["current"]["median_s"]
    # one repeat: its marks (s since the process start) are the figures; each phase runs from its
    # mark to the next, so they add up to the time before the first step and after the last
    marks = result["raw_marks_s"][0]
    for name, a, b in startup.BEFORE + startup.AFTER:
        assert med[name] == marks[b] - marks[a], name
    assert sum(med[n] for n, _, _ in startup.BEFORE) == pytest.approx(med["to_first_step"])
    assert sum(med[n] for n, _, _ in startup.AFTER) == pytest.approx(med["after_last_step"])
    # a single run has no torchrun and no worker process (those phases are 0); every other phase took time
    absent = {"plan_and_torchrun_start", "worker_imports"}
    assert {n: med[n] for n in absent} == dict.fromkeys(absent, 0.0)
    assert all(med[n] > 0 for n, _, _ in startup.BEFORE + startup.AFTER if n not in absent), med
    assert med["to_first_step"] == marks["first_step"] and med["wall"] == marks["end"] < elapsed_s  # our stopwatch
    assert med["steps"] == marks["last_step"] - marks["first_step"] > 0
    assert med["fixed"] == pytest.approx(marks["end"] - (marks["last_step"] - marks["first_step"]))
    assert 0 < med["to_first_step"] < med["wall"]
    assert med["writer_start_ms"] == 0 and result["params"]["tracking"] is False  # no tracking: no writer
    assert len(result["current"]["repeats_s"]) == 1 and len(result["raw_marks_s"]) == 1
    assert result["largest_fixed_cost"]["median_s"] == max(med[n] for n, _, _ in startup.BEFORE + startup.AFTER)
    assert result["previous"] == earlier and result["fixed_vs_previous"] == pytest.approx(med["fixed"] / 1e-3)
    assert result["dropped"] == [] and len(result["disturbance"]) == 1
    summary = stats.read_summary(out)
    assert summary["startup_fixed_cost"].endswith("; goal < 40% of previous: not met")  # 1 ms before: not under 40%
    for figure in ("wall", "first_step"):  # tracking off: the hand-written script (it logs to MLflow) does not apply
        assert summary[f"startup_vs_handwritten_{figure}"].endswith(": not measured")
    assert sorted(p.name for p in out.iterdir()) == ["startup.json", "summary.md"]  # work folder removed


def test_the_same_code_keeps_the_previous_figures_it_found(tmp_path, monkeypatch):
    monkeypatch.setattr(startup, "_git_commit", lambda: "abc")
    old = {"commit": "abc", "median_s": {"fixed": 2.0}}
    (tmp_path / "startup.json").write_text(json.dumps({"current": old, "previous": {"commit": "old"}}))
    assert startup._previous(tmp_path) == {"commit": "old"}
    monkeypatch.setattr(startup, "_git_commit", lambda: "def")
    assert startup._previous(tmp_path) == old
    assert startup._previous(tmp_path / "none") is None


def test_marks_go_to_the_named_file_only(tmp_path, monkeypatch):
    monkeypatch.delenv(timings.ENV, raising=False)
    timings.mark("nowhere")
    monkeypatch.setenv(timings.ENV, str(tmp_path / "t.jsonl"))
    monkeypatch.setenv("RANK", "1")
    timings.mark("a")
    timings.mark("b")
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["a", "b"] and rows[0]["rank"] == 1 and rows[0]["t"] <= rows[1]["t"]


def default_params() -> dict:
    import yaml

    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_the_handwritten_script_is_the_default_job_and_refuses_others(tmp_path):
    params = default_params()
    cmd, reason = startup.command(params, tmp_path / "train.pt")
    assert reason == "" and str(startup.SCRIPT) in cmd and f"--data={tmp_path / 'train.pt'}" in cmd
    assert f"--epochs={params['train']['epochs']}" in cmd and f"--lr={params['train']['lr']}" in cmd
    params["train"]["strategy"] = "fsdp"
    cmd, reason = startup.command(params, tmp_path / "train.pt")
    assert cmd is None and "'strategy': 'fsdp'" in reason


def test_the_comparison_pairs_runs_and_refuses_different_jobs():
    ours = [{"wall": 11.0, "first_step": 3.0, "steps": 5}, {"wall": 13.0, "first_step": 2.0, "steps": 5}]
    theirs = [{"wall": 10.0, "first_step": 2.0, "steps": 5}, {"wall": 10.0, "first_step": 2.0, "steps": 5}]
    result = startup.compare(ours, theirs)
    assert result["wall"]["repeat_ratios"] == [1.1, 1.3] and result["wall"]["median_ratio"] == pytest.approx(1.2)
    assert result["first_step"]["median_ratio"] == pytest.approx(1.25) and result["steps"] == 5
    with pytest.raises(RuntimeError, match=r"ran \[5, 6\] steps"):
        startup.compare(ours, [{**theirs[0], "steps": 6}, theirs[1]])


@pytest.mark.slow
def test_startup_measures_scalelab_train_beside_the_handwritten_script(workdir):
    out = workdir / "bench"
    args = ["bench", "startup", "--out", str(out), "--params", str(REPO / "params.yaml"), "--repeats", "1"]
    assert main([*args, "--epochs", "1", "--max-busy-share", "1"]) == 0  # one epoch of the default ddp job, tracked
    result = json.loads((out / "startup.json").read_text())
    versus = result["vs_handwritten"]
    assert versus["steps"] == result["raw_marks_s"][0]["steps_trained"] > 0  # the same job
    ours = result["raw_marks_s"][0]
    assert versus["wall"]["scalelab_s"] == [ours["end"]] and versus["first_step"]["scalelab_s"] == [ours["first_step"]]
    for figure in ("wall", "first_step"):
        [mine], [theirs] = versus[figure]["scalelab_s"], versus[figure]["handwritten_s"]
        assert 0 < theirs and versus[figure]["median_ratio"] == pytest.approx(mine / theirs)
    summary = stats.read_summary(out)
    for figure in ("wall", "first_step"):  # each verdict is its figure against its goal, as written beside it
        ratio, goal = versus[figure]["median_ratio"], startup.GOALS[figure].target
        name, text, goal_text, verdict = summary_verdict(summary[f"startup_vs_handwritten_{figure}"])
        assert goal_text == f"<= {goal:.2f}" and f"hand-written torchrun script {figure.replace('_', ' ')} " in text
        assert f" {ratio:.3f} (95% CI " in text
        assert verdict == ("met" if ratio <= goal else "not met")
