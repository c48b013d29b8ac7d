"""launch.local's rank protocol (spec.json -> ranks -> out.json): what a failed rank reports, and
that only rank 0's result comes back. Its success path under torchrun runs in every study test and
in the parity, loader and stop-flag benchmark tests."""

import json

import pytest

from scalelab.launch.local import LaunchError, run_ranks, serve_rank


@pytest.mark.integration  # a worker process (the scalelab CLI)
def test_a_rank_that_fails_raises_its_exit_status_and_last_stderr_lines_not_a_stale_result(tmp_path):
    (tmp_path / "bad.out.json").write_text('{"from": "an earlier run"}')
    with pytest.raises(LaunchError, match=r"^exit 1: .*KeyError: 'input_shape'"):  # the spec's first missing key
        run_ranks(["bench-worker", "stopflag"], {"steps": 1}, tmp_path, "bad", nproc=None, threads_per_process=1)
    assert json.loads((tmp_path / "bad.spec.json").read_text()) == {"steps": 1}
    assert not (tmp_path / "bad.out.json").exists()


@pytest.mark.parametrize("is_main", [True, False])
def test_only_the_main_rank_writes_its_result(tmp_path, is_main):
    (tmp_path / "spec.json").write_text('{"x": 2}')
    serve_rank(lambda spec: {"double": 2 * spec["x"], "is_main": is_main}, tmp_path / "spec.json", tmp_path / "out")
    assert (json.loads((tmp_path / "out").read_text()) == {"double": 4}) if is_main else not (tmp_path / "out").exists()
