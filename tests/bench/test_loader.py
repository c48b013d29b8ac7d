"""`scalelab bench loader` on one tiny epoch per arm: the JSON's shape and the summary lines."""

import json
import statistics

import pytest

from helpers import REPO
from scalelab.bench import stats
from scalelab.cli import main

TINY = ["--params", str(REPO / "params.yaml"), "--repeats", "2", "--epochs", "1", "--set", "train.batch_size=128"]
TINY += ["--max-busy-share", "1.0"]  # keep every repeat: xdist workers share the machine
SINGLE = ["--set", "train.strategy=single", "--set", "train.nproc_per_node=1"]


def _check(result: dict, world_size: int) -> None:
    assert result["job"]["world_size"] == world_size and result["job"]["per_rank_batch"] == 128
    assert set(result["num_workers"]) == {"0", "2"}
    for arm in result["num_workers"].values():
        wait, compute = arm["wait_ms_per_step"], arm["compute_ms_per_step"]  # rank -> repeat
        assert len(wait) == len(compute) == world_size and all(len(r) == 2 for r in wait + compute)  # every rank
        # a repeat's fraction: wait / (wait + compute), on the rank that waited most
        fractions = [max(w[i] / (w[i] + c[i]) for w, c in zip(wait, compute)) for i in range(2)]
        assert all(0 < f < 1 for f in fractions) and arm["repeat_wait_fractions"] == pytest.approx(fractions)
        assert arm["wait_fraction"] == pytest.approx(statistics.median(fractions))
    assert result["dropped"] == [] and len(result["disturbance"]) == 2


def test_loader_benchmark_reports_the_wait_fraction_for_each_num_workers(workdir, capsys):
    assert main(["bench", "loader", "--out", str(workdir / "bench"), *TINY, *SINGLE]) == 0
    assert "- loader_workers0: step time waiting for data " in capsys.readouterr().out
    result = json.loads((workdir / "bench/loader.json").read_text())
    assert result["benchmark"] == "loader" and "interleaved" in result["method"]
    _check(result, 1)
    lines = stats.read_summary(workdir / "bench")
    assert sorted(lines) == ["loader_workers0", "loader_workers2"]
    for arm, line in (("0", lines["loader_workers0"]), ("2", lines["loader_workers2"])):
        assert line.endswith(": met" if result["num_workers"][arm]["wait_fraction"] <= 0.05 else ": not met")
    assert sorted(p.name for p in (workdir / "bench").iterdir()) == ["loader.json", "summary.md"]


@pytest.mark.distributed
def test_loader_benchmark_runs_the_default_ddp_job_on_two_processes(workdir):
    assert main(["bench", "loader", "--out", str(workdir / "bench"), *TINY]) == 0
    result = json.loads((workdir / "bench/loader.json").read_text())
    assert result["job"]["strategy"] == "ddp"
    _check(result, 2)
