"""`scalelab bench checkpoint` at two sizes and 1 and 2 ranks: the JSON's fields and headline, and
per-rank peak memory (VmHWM) on gpt: an fsdp save or load holds the rank's shard of the state plus
a margin, where ddp's full-state save and load hold the whole state; fsdp's build on the meta
device leaves a second rank about half of one rank's peak."""

import json

import pytest

from scalelab.bench import stats
from scalelab.cli import main

pytestmark = [pytest.mark.distributed, pytest.mark.integration, pytest.mark.slow]
MARGIN = 8 * 2**20  # the save's own buffers besides the live shards: a bound, not a goal


def test_an_fsdp_save_holds_its_shard_and_ddp_the_whole_state(workdir, capsys):
    args = ["--ckpt-params", "100000", "3000000", "--ckpt-ranks", "1", "2", "--repeats", "1", "--max-busy-share", "1"]
    assert main(["bench", "checkpoint", *args, "--out", str(workdir / "bench")]) == 0
    assert "- checkpoint_fsdp_save_2_over_1: fsdp save per rank, 2 ranks / 1" in capsys.readouterr().out
    result = json.loads((workdir / "bench/checkpoint.json").read_text())
    rows = {(r["strategy"], r["world_size"], r["parameters"]): r for r in result["rows"]}
    sizes = sorted({r["parameters"] for r in result["rows"]})
    assert len(rows) == 12 and sizes[1] > 20 * sizes[0]  # 3 arms x 2 world sizes x 2 sizes
    assert set(result["goal"]) == {"parameters", "fsdp_save_2_over_1", "async_blocked_fraction"}
    line = stats.read_summary(workdir / "bench")["checkpoint_fsdp_save_2_over_1"]  # the verdict: in summary.md only
    assert line.endswith(": met" if result["goal"]["fsdp_save_2_over_1"] <= 0.6 else ": not met")
    assert result["dropped"] == []
    big = sizes[1]
    for world in (1, 2):
        fsdp, ddp = rows[("fsdp", world, big)], rows[("ddp", world, big)]
        assert fsdp["save_s"] > 0 and fsdp["load_s"] > 0
        shard = fsdp["state_bytes"] / world  # 37 MB of weights and AdamW moments, split over the ranks
        assert fsdp["peak_save_bytes_per_rank"] <= shard + MARGIN, (world, fsdp)
        assert max(fsdp["peak_load_bytes_by_rank"]) <= shard + MARGIN, (world, fsdp)  # loaded into its shards
        # the full-state save gathers and serializes the whole state on rank 0, and every rank loads
        # the whole file: the measure sees them
        assert ddp["peak_save_bytes_per_rank"] >= 0.9 * ddp["state_bytes"], (world, ddp)
        assert min(ddp["peak_load_bytes_by_rank"]) >= 0.9 * ddp["state_bytes"], (world, ddp)
    # fsdp builds on the meta device: rank 1 allocates only its shards (rank 0 also holds the initial
    # state on its CPU, to send); one rank builds the whole model
    one, two = rows[("fsdp", 1, big)], rows[("fsdp", 2, big)]
    assert two["peak_build_bytes_by_rank"][1] <= 0.6 * one["peak_build_bytes_by_rank"][0], (one, two)
