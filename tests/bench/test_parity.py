"""`scalelab bench parity` on tiny sizes: the JSON's shape, the weight check, the summary lines."""

import argparse
import ast
import json
import statistics

import pytest

from helpers import REPO, paired_bootstrap_ci
from scalelab.bench import harness, parity, plain_loop, stats
from scalelab.cli import main

TINY = [
    "--params",
    str(REPO / "params.yaml"),
    "--repeats",
    "2",
    "--steps",
    "2",
    "--warmup-steps",
    "1",
    "--check-steps",
    "2",
    "--batch-size",
    "16",
    "--num-features",
    "8",
    "--hidden",
    "16",
    "--max-busy-share",
    "1.0",  # keep every repeat: xdist workers share the machine (dropping is tested in test_harness)
]


def _check(result: dict, strategy: str, world_size: int) -> None:
    p = result["strategies"][strategy]
    assert p["world_size"] == world_size
    assert p["bitwise_identical"] is True and p["max_abs_weight_diff"] == 0.0
    reps = p["repeat_step_ms"]  # per repeat, the slowest rank's step time of each arm
    assert len(reps["engine"]) == len(reps["plain"]) == 2 and min(reps["plain"]) > 0
    ratios = [e / q for e, q in zip(reps["engine"], reps["plain"])]
    assert p["repeat_ratios"] == pytest.approx(ratios) and p["median_ratio"] == pytest.approx(statistics.median(ratios))
    assert p["median_step_ms"] == pytest.approx({arm: statistics.median(ms) for arm, ms in reps.items()})
    # the interval, recomputed from the raw repeats by the stated method (not the benchmark's code)
    boot = p["bootstrap"]
    assert boot["unit"] == "repeat (pair)" and boot["resamples"] >= 1000
    expected = paired_bootstrap_ci(reps["engine"], reps["plain"], boot["resamples"], boot["seed"])
    assert p["ci95"] == pytest.approx(list(expected))
    assert p["ci95"][0] < p["ci95"][1] or ratios[0] == ratios[1]  # two different ratios: a real interval
    assert p["dropped"] == []


def test_single_process_parity_writes_ratio_interval_and_identical_weights(workdir, capsys):
    assert main(["bench", "parity", "--out", str(workdir / "bench"), "--strategies", "single", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "- parity_single: engine/plain step time " in printed and "; 0 busy repeats dropped" in printed
    result = json.loads((workdir / "bench/parity.json").read_text())
    assert result["benchmark"] == "parity" and "interleaved" in result["method"]
    assert result["workload"]["batch_size"] == 16 and result["workload"]["model"]["hidden"] == [16]
    _check(result, "single", 1)
    line = stats.read_summary(workdir / "bench")["parity_single"]  # the verdict: the median ratio against 1.01
    assert line.endswith(": met" if result["strategies"]["single"]["median_ratio"] <= 1.01 else ": not met")
    assert list(stats.read_summary(workdir / "bench")) == ["parity_single"]
    assert sorted(p.name for p in (workdir / "bench").iterdir()) == ["parity.json", "summary.md"]  # temp removed


@pytest.mark.distributed
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_parity_at_two_processes_has_identical_weights_on_every_rank(workdir, strategy):
    # both arms clip (below this workload's gradient norms) and follow a warm-up + cosine schedule
    assert main(["bench", "parity", "--out", str(workdir / "bench"), "--strategies", strategy, *TINY]) == 0
    result = json.loads((workdir / "bench/parity.json").read_text())
    _check(result, strategy, 2)
    assert result["workload"]["backend"] == "gloo" and result["workload"]["ddp_processes"] == 2
    assert result["workload"]["grad_clip_norm"] > 0 and result["workload"]["lr_schedule"]["kind"] == "cosine"


def test_weights_that_differ_are_reported_and_fail_the_benchmark(workdir, monkeypatch):
    def fake(self, worker, spec, name, nproc):
        return {
            "step_s": {"engine": [1.0, 1.0], "plain": [1.0, 1.0]},
            "bitwise_identical": False,
            "max_abs_weight_diff": 1e-7,
            "ranks": 1,
            "num_params": 10,
            "dropped": [],
            "disturbance": [],
        }

    monkeypatch.setattr(harness.Context, "ranks", fake)
    args = argparse.ArgumentParser()
    parity.BENCH.add_arguments(args)
    with pytest.raises(parity.ParityError, match="differ .* single"):
        harness.run(parity.BENCH, args.parse_args([*TINY, "--strategies", "single"]), workdir / "bench")
    result = json.loads((workdir / "bench/parity.json").read_text())
    assert result["bitwise_identical"] is False
    assert stats.read_summary(workdir / "bench")["parity_single"].endswith(": not met")


def test_compare_sees_a_one_ulp_difference():
    torch = pytest.importorskip("torch")
    a = plain_loop.PlainLoop(plain_loop.build_model(4, [3], 2, 0.0), parity.OPTIM, parity.CLIP, parity.SCHEDULE)
    b = plain_loop.PlainLoop(plain_loop.build_model(4, [3], 2, 0.0), parity.OPTIM, parity.CLIP, parity.SCHEDULE)
    b.model.load_state_dict(a.model.state_dict())
    assert a.forward is a.model  # neither ddp nor fsdp asked: the plain model, unwrapped
    assert parity._compare(a.weights(), b.weights())["identical"]
    with torch.no_grad():
        w = b.model[1].weight
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(1.0))
    assert not parity._compare(a.weights(), b.weights())["identical"]


def test_the_plain_loop_imports_nothing_from_scalelab():
    tree = ast.parse((REPO / "libs/scalelab/bench/plain_loop.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n.split(".")[0] == "scalelab"], names
