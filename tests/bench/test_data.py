"""`scalelab bench data` at two sizes 10x apart: the JSON's fields, the summary lines, and per-rank
anonymous memory that does not grow with the data (memory-mapped splits)."""

import json

import pytest

from scalelab.bench import stats
from scalelab.cli import main

pytestmark = [pytest.mark.distributed, pytest.mark.integration]
SIZES_MB = (3, 30)


def test_rss_anon_per_rank_stays_flat_from_3_to_30_mb_of_tokens(workdir, capsys):
    args = ["--sizes-mb", *map(str, SIZES_MB), "--steps", "4", "--repeats", "1", "--out", str(workdir / "bench")]
    args += ["--max-busy-share", "1", "--csv-rows", "100", "1000"]  # every repeat kept: xdist workers share the machine
    assert main(["bench", "data", *args]) == 0
    assert "- data_rss_anon_slope: per-rank RssAnon log-log slope " in capsys.readouterr().out
    result = json.loads((workdir / "bench/data.json").read_text())
    small, large = result["rows"]
    assert (small["size_mb"], large["size_mb"]) == SIZES_MB
    assert large["prepared_bytes"] > 9 * small["prepared_bytes"]
    for row in (small, large):  # every rank read every sample of its share through the map
        share = row["train_samples"] // 2
        assert all(share - 256 < n <= share for n in row["samples_fetched"]), row["samples_fetched"]
        assert set(row["loader"]) == {"0", "2"}
    # Loaded whole, 27 MB more tokens would add at least 27 MB per rank (216 MB as int64 tensors).
    for rank in range(2):
        grew = large["rss_anon_after_full_pass_mb"][rank] - small["rss_anon_after_full_pass_mb"][rank]
        assert grew < 0.25 * (SIZES_MB[1] - SIZES_MB[0]), f"rank {rank}: RssAnon grew {grew:.1f} MiB"
    assert result["verify_10gb_sparse_s"] > 0 and "sparse" in result["method"]
    lines = stats.read_summary(workdir / "bench")
    assert sorted(lines) == sorted(
        [
            "data_rss_anon_slope",
            "data_prepare_slope",
            "data_prepare_peak_slope",
            "data_verify_10gb",
            "data_loader_wait_workers0",
            "data_loader_wait_workers2",
        ]
    )
    assert result["csv_rows"]["rows"] == [100, 1000] and min(result["csv_rows"]["prepare_s"]) > 0
    slope = result["slopes"]["rss_anon_per_rank"]
    assert lines["data_rss_anon_slope"].endswith(": met" if slope < 0.1 else ": not met")
