"""benchmarks/gpu.sh on CPU: its argument handling, its refusal without CUDA, and its dry run."""

import os
import subprocess

import pytest

from helpers import REPO

SCRIPT = REPO / "benchmarks/gpu.sh"


def gpu_sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=60
    )


def test_dry_run_prints_one_study_of_every_strategy_and_precision_parity_and_mfu_and_runs_nothing(tmp_path):
    out = tmp_path / "bench"
    got = gpu_sh("--dry-run", "--gpus", "8", "--out", str(out))
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert "world sizes 1, 2, 4, 8" in lines[0] and "dry run" in lines[0]
    assert sum(" speedup --params " in line for line in lines) == 1
    writer = next(line for line in lines if "params.yaml" in line and "yaml.safe_load" in line)
    assert "1\\,2\\,4\\,8" in writer  # the world sizes handed to the study
    for name in ("fp32", "bf16", "fp16", "fsdp", "dp", "cuda"):
        assert f'"{name}"' in writer, name
    assert sum(" bench parity " in line for line in lines) == 1
    mfu = [line for line in lines if " bench mfu " in line]
    assert len(mfu) == 1 and "--device cuda --precision bf16" in mfu[0] and f"--out {out}" in mfu[0]
    assert not out.exists()  # nothing ran


def test_dry_run_world_sizes_end_at_the_gpu_count_and_parity_can_be_left_out():
    one = gpu_sh("--dry-run", "--gpus", "1")
    six = gpu_sh("--dry-run", "--gpus", "6", "--skip-parity")
    assert one.returncode == six.returncode == 0
    assert "world sizes 1, out" in one.stdout.splitlines()[0] and "1\\,2" not in one.stdout
    assert "world sizes 1, 2, 4, 6," in six.stdout and " bench parity " not in six.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown argument '--bogus'"),
        (["--gpus", "0"], "--gpus = '0' is not a positive whole number"),
        (["--gpus", "two"], "--gpus = 'two' is not a positive whole number"),
        (["--gpus"], "--gpus needs a number"),
        (["--dry-run", "--gpus", "2", "--params", "missing.yaml"], "--params missing.yaml: no such file"),
    ],
)
def test_bad_arguments_exit_2_with_one_clear_line(args, message):
    got = gpu_sh(*args)
    assert got.returncode == 2 and message in got.stderr and got.stdout == ""


def test_help_exits_0_with_the_usage():
    got = gpu_sh("--help")
    assert got.returncode == 0 and got.stdout.startswith("usage: benchmarks/gpu.sh")


def test_without_cuda_it_refuses_to_start(tmp_path):
    got = gpu_sh("--out", str(tmp_path / "bench"), CUDA_VISIBLE_DEVICES="")
    assert got.returncode == 2, got.stdout
    assert "no CUDA device visible" in got.stderr and "--dry-run" in got.stderr
    assert not (tmp_path / "bench").exists()
