"""`scalelab bench store`: dvc push/pull and a sharded checkpoint against boto3, on the real local S3
server, with every byte checked; the JSON and summary lines carry the paired figures."""

import json

import pytest

from scalelab.bench import stats, store
from scalelab.cli import main

pytestmark = pytest.mark.integration


def test_store_benchmark_pairs_every_transfer_with_a_plain_client(workdir, capsys):
    out = workdir / "bench"
    argv = ["bench", "store", "--out", str(out), "--sizes-mb", "1", "3", "--checkpoint-mb", "2", "--repeats", "2"]
    argv += ["--max-busy-share", "1"]  # keep every round: xdist workers share the machine
    assert main(argv) == 0
    assert "- store_push_1mb: push 1mb: scalelab/plain S3 client " in capsys.readouterr().out
    result = json.loads((out / store.OUT_FILE).read_text())
    names = {"push_1mb", "pull_1mb", "push_3mb", "pull_3mb", "checkpoint_save", "checkpoint_load"}
    assert set(result["figures"]) == names
    for name, fig in result["figures"].items():
        assert len(fig["arm_s"]) == len(fig["plain_s"]) == 2 and min(fig["arm_s"] + fig["plain_s"]) > 0, name
        assert fig["median_ratio"] == pytest.approx(stats.median_ratio(fig["arm_s"], fig["plain_s"]))
    summary = stats.read_summary(out)  # each verdict: in summary.md only
    for name, fig in result["figures"].items():
        assert summary[f"store_{name}"].endswith(": met" if fig["median_ratio"] <= 1.2 else ": not met"), name
