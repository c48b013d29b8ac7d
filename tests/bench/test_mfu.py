"""scalelab bench mfu on tiny sizes: the JSON's fields, analytic vs counted FLOPs, MFU only with a
peak, the CUDA peak table, the summary line. No speed assertions."""

import argparse
import json
import re
import statistics

import pytest
import torch

from helpers import REPO, run_cli, summary_verdict
from scalelab.bench import harness, mfu, stats

TINY = ["--batch", "2", "--seq", "32", "--layers", "2", "--d-model", "64", "--vocab", "128"]
TINY += ["--steps", "2", "--repeats", "2", "--warmup-steps", "1", "--max-busy-share", "1.0"]  # keep every repeat
FIELDS = {
    "benchmark", "method", "device", "precision", "config", "params", "flops_per_step_analytic",
    "flops_per_step_counted", "step_time_s_median", "repeats", "achieved_tflops", "peak_tflops", "mfu",
}  # fmt: skip


def args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    mfu.BENCH.add_arguments(parser)
    return parser.parse_args([*TINY, *extra])


def verdict_of(result: dict, line: str) -> str:
    """summary.md's verdict for `mfu`, after checking that it is the JSON's MFU against the goal of 30%,
    both as written in the line."""
    _, text, goal, verdict = summary_verdict(line)
    assert goal == "MFU >= 30%"
    if result["mfu"] is None:
        assert verdict == "not measured" and "MFU null" in text
        return verdict
    written = re.search(r"; MFU ([0-9.]+)% of ", text)
    assert written and written[1] == f"{100 * result['mfu']:.1f}", text
    assert verdict == ("met" if result["mfu"] >= 0.30 else "not met")
    return verdict


def test_without_a_peak_it_records_flops_and_leaves_mfu_null(tmp_path):
    result = harness.run(mfu.BENCH, args(), tmp_path)
    on_disk = json.loads((tmp_path / "mfu.json").read_text())
    assert FIELDS <= on_disk.keys() and on_disk == json.loads(json.dumps(result))
    assert on_disk["benchmark"] == "mfu" and "6*N + 12*n_layer*d_model*seq" in on_disk["method"]
    assert on_disk["device"].startswith("cpu") and on_disk["precision"] == "fp32" and on_disk["repeats"] == 2
    assert len(on_disk["step_time_s"]) == 2 and on_disk["step_time_s_median"] > 0
    assert on_disk["config"]["layers"] == 2 and on_disk["config"]["heads"] == 1  # d_model 64 / 64
    # experiments/gpt.py at d 64, 2 layers, vocab 128, seq 32, MLP 4x, counted by hand: a block has
    # 2 LayerNorms (2 x 2d), qkv (d x 3d + 3d), proj (d x d + d), MLP (d x 4d + 4d, 4d x d + d)
    d = 64
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    n = 2 * block + 2 * d + d * 128  # blocks, the final LayerNorm, the untied head (no bias)
    assert on_disk["matmul_params"] == n == 108_288
    assert on_disk["params"] == n + 128 * d + 32 * d  # and the token and position embeddings
    # 6*N + 12*L*d*T per token, times batch*seq tokens
    assert on_disk["flops_per_step_analytic"] == (6 * n + 12 * 2 * d * 32) * 2 * 32
    assert on_disk["step_time_s_median"] == statistics.median(on_disk["step_time_s"])
    assert on_disk["achieved_tflops"] == pytest.approx(
        on_disk["flops_per_step_analytic"] / statistics.median(on_disk["step_time_s"]) / 1e12
    )
    assert on_disk["mfu"] is None and on_disk["peak_tflops"] is None
    assert on_disk["mfu_reason"] == "peak FLOP/s unknown for this device; pass --peak-tflops"
    line = stats.read_summary(tmp_path)["mfu"]
    assert verdict_of(on_disk, line) == "not measured" and "GFLOP/s" in line


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_counted_flops_agree_with_the_analytic_estimate(tmp_path, precision):
    result = harness.run(mfu.BENCH, args("--precision", precision, "--repeats", "1"), tmp_path)
    assert result["flops_per_step_counted"] > 0
    assert 0.75 <= result["flops_per_step_counted"] / result["flops_per_step_analytic"] <= 1.25


def test_with_a_peak_mfu_is_achieved_over_peak(tmp_path):
    result = harness.run(mfu.BENCH, args("--peak-tflops", "0.5"), tmp_path)
    assert result["peak_tflops"] == 0.5 and result["peak_source"] == "--peak-tflops"
    assert result["mfu"] == pytest.approx(result["achieved_tflops"] / 0.5) and result["mfu_reason"] is None
    line = stats.read_summary(tmp_path)["mfu"]
    assert verdict_of(result, line) in ("met", "not met") and "of 0.5 TFLOP/s" in line


@pytest.mark.parametrize("fraction", [0.29, 0.31])
def test_the_verdict_is_the_mfu_against_its_goal(tmp_path, monkeypatch, fraction):
    # a measurement whose MFU against a 1 TFLOP/s peak is `fraction`: 1e12 FLOPs a step, 1 / fraction s a step
    measured = {
        "model": mfu.model_config(args()), "params": 1, "matmul_params": 1, "tokens_per_step": 64,
        "flops_per_step_analytic": 10**12, "flops_per_step_counted": 10**12, "step_time_s": [1 / fraction],
        "final_loss": 1.0, "device": torch.device("cpu"), "busy": harness.Repeats([1 / fraction], [], []),
    }  # fmt: skip
    monkeypatch.setattr(mfu, "measure_steps", lambda a, policy: dict(measured))
    result = harness.run(mfu.BENCH, args("--peak-tflops", "1"), tmp_path)
    assert result["mfu"] == pytest.approx(fraction)
    assert verdict_of(result, stats.read_summary(tmp_path)["mfu"]) == ("met" if fraction > 0.30 else "not met")


@pytest.mark.parametrize(
    ("name", "precision", "peak"),
    [
        ("NVIDIA H200", "bf16", 989.0),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA H200", "fp32", None),  # the table is bf16 only
        ("Tesla T4", "bf16", None),
    ],
)
def test_the_cuda_peak_comes_from_the_table_by_device_name(monkeypatch, name, precision, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    got, source = mfu.peak_tflops(torch.device("cuda"), precision, None)
    assert got == peak and (source is None) == (peak is None)
    assert mfu.peak_tflops(torch.device("cuda"), precision, 100.0) == (100.0, "--peak-tflops")
    assert mfu.peak_tflops(torch.device("cpu"), "bf16", None) == (None, None)


@pytest.mark.parametrize(("extra", "message"), [(["--steps", "0"], "--steps = 0"), (["--peak-tflops", "-1"], "> 0")])
def test_bad_sizes_and_peaks_are_refused_before_anything_runs(tmp_path, monkeypatch, extra, message):
    monkeypatch.setattr(harness, "rank_loop", lambda *a, **k: pytest.fail("the workload was built"))
    with pytest.raises(ValueError, match=message):
        harness.run(mfu.BENCH, args(*extra), tmp_path)
    assert not (tmp_path / "mfu.json").exists()


def test_the_cli_runs_it_as_a_benchmark(tmp_path):
    got = run_cli("bench", "mfu", *TINY, "--repeats", "1", "--out", str(tmp_path), cwd=REPO, timeout=120)
    assert got.stdout.startswith("scalelab bench mfu: measuring") and "; goal MFU >= 30%: not measured" in got.stdout
    assert json.loads((tmp_path / "mfu.json").read_text())["benchmark"] == "mfu"
