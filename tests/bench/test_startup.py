"""`scalelab bench startup` on a tiny run: the phases, the largest fixed cost and the side-by-side
comparison with an earlier commit's figures (not their speed)."""

import json
import time

import pytest

from helpers import REPO
from scalelab.bench import startup, stats
from scalelab.cli import main
from scalelab.runtime import timings


def test_startup_benchmark_times_every_phase_of_a_real_train_run(workdir):
    out = workdir / "bench"
    out.mkdir()
    earlier = {"commit": "0" * 40, "median_s": {"fixed": 1e-3}}  # an earlier commit's figures
    (out / "startup.json").write_text(json.dumps({"current": earlier, "previous": None}))
    args = ["bench", "startup", "--out", str(out), "--params", str(REPO / "params.yaml"), "--repeats", "1"]
    args += ["--epochs", "1", "--strategy", "single", "--no-tracking"]  # the quickest real run
    start = time.monotonic()
    assert main(args) == 0
    elapsed_s = time.monotonic() - start
    result = json.loads((out / "startup.json").read_text())
    assert result["benchmark"] == "startup" and "SCALELAB_TIMINGS" in result["method"]
    med = result["current"]["median_s"]
    for name, _, _ in startup.BEFORE + startup.AFTER:
        assert med[name] >= 0, name
    # one repeat: its marks (s since the process start) are the figures
    marks = result["raw_marks_s"][0]
    assert med["to_first_step"] == marks["first_step"] and med["wall"] == marks["end"] < elapsed_s  # our stopwatch
    assert med["steps"] == marks["last_step"] - marks["first_step"] > 0
    assert med["fixed"] == pytest.approx(marks["end"] - (marks["last_step"] - marks["first_step"]))
    assert 0 < med["to_first_step"] < med["wall"]
    assert med["writer_start_ms"] == 0 and result["params"]["tracking"] is False  # no tracking: no writer
    assert len(result["current"]["repeats_s"]) == 1 and len(result["raw_marks_s"]) == 1
    assert result["largest_fixed_cost"]["median_s"] == max(med[n] for n, _, _ in startup.BEFORE + startup.AFTER)
    assert result["previous"] == earlier and result["meets_goal"] is False  # 1 ms before: not under 40% of it
    assert result["side_by_side_s"]["fixed"] == [1e-3, med["fixed"]]
    assert stats.read_summary(out)["startup_fixed_cost"].endswith(": not met")
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
