"""`scalelab bench search`: the arms it runs, the figures it takes from each sweep's summary, and
a verdict that is TPE's best val_loss and compute against random's."""

import argparse
import json

import pytest

from helpers import REPO
from scalelab.bench import harness, search, stats
from scalelab.runtime import disturbance


def args(*argv):
    parser = argparse.ArgumentParser()
    search.BENCH.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("tpe", "rnd", "verdict"),
    [
        ((0.10, 900), (0.12, 1200), "met"),  # lower loss, fewer steps
        ((0.10, 1300), (0.12, 1200), "not met"),  # lower loss, but more steps
        ((0.13, 900), (0.12, 1200), "not met"),  # fewer steps, but a higher loss
        ((None, 900), (0.12, 1200), "not measured"),  # no TPE trial finished
    ],
)
def test_the_verdict_is_tpe_against_random(tmp_path, monkeypatch, tpe, rnd, verdict):
    got = {"tpe_median": tpe, "random": rnd, "grid": (0.2, 1200)}

    def arm(work, name, a, seed, data):
        loss, steps = got[name]
        return {"arm": name, "seed": seed, "best_val_loss": loss, "compute_steps": steps, "wall_s": 1.0}

    monkeypatch.setattr(search, "run_arm", arm)
    monkeypatch.setattr("scalelab.data.prepare.prepare", lambda cfg, out: None)
    # an idle machine: the verdict is the claim (beside other tests, a real measure dropped repeats)
    monkeypatch.setattr(disturbance, "share", lambda *a, **k: disturbance.Share(0.0, 0.0, 1.0))
    result = harness.run(search.BENCH, args(), tmp_path)
    assert result["arms"]["tpe_median"]["compute_steps_median"] == tpe[1]
    line = stats.read_summary(tmp_path)["search"]
    assert (
        line.endswith(f": {verdict}")
        and f"tpe_median best val_loss {'none' if tpe[0] is None else f'{tpe[0]:.4f}'}" in line
    )
    assert "; 0 busy repeats dropped; goal " in line and result["dropped"] == []


def test_a_busy_repeat_is_run_again_on_the_next_seed_and_dropped(tmp_path, monkeypatch):
    held = iter([0.9, 0.0, 0.0])  # the first repeat busy: others held 90% of the CPU
    monkeypatch.setattr(disturbance, "share", lambda *a, **k: disturbance.Share(next(held), 0.0, 1.0))

    def arm(work, name, a, seed, data):
        return {"arm": name, "seed": seed, "best_val_loss": 0.1, "compute_steps": 100, "wall_s": 1.0}

    monkeypatch.setattr(search, "run_arm", arm)
    monkeypatch.setattr("scalelab.data.prepare.prepare", lambda cfg, out: None)
    result = harness.run(search.BENCH, args("--repeats", "2"), tmp_path)
    assert [r["seed"] for r in result["runs"]] == [1, 1, 1, 2, 2, 2]  # every arm of the kept repeats, seed 0 dropped
    assert [d["others_cpu_share"] for d in result["dropped"]] == [0.9]
    assert "; 1 busy repeat dropped (" in stats.read_summary(tmp_path)["search"]


def test_each_arm_trains_the_shrunk_params_on_the_same_budget(tmp_path):
    params = search._params(REPO, epochs=2, seed=3)
    assert params["train"]["strategy"] == "single" and params["train"]["epochs"] == 2 and params["train"]["seed"] == 3
    assert params["sweep"]["launcher"] == "local" and params["tracking"]["system_metrics_interval_s"] == 0
    assert args().trials == len(search.GRID_LRS) * 2  # the grid's size: every arm's budget


@pytest.mark.integration
def test_a_tiny_search_runs_every_arm_for_real(tmp_path):
    out = tmp_path / "bench"
    harness.run(search.BENCH, args("--trials", "2", "--epochs", "1", "--parallel", "1", "--max-busy-share", "1"), out)
    result = json.loads((out / "search.json").read_text())
    assert [r["arm"] for r in result["runs"]] == list(search.ARMS)
    for run in result["runs"]:
        assert run["trials"] == 2 and run["compute_steps"] > 0 and run["wall_s"] > 0, run
    assert set(stats.read_summary(out)) == {"search"}
