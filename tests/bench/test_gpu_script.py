"""benchmarks/gpu.sh on CPU: its argument handling, its refusal without CUDA, and its dry run."""

import os
import re
import subprocess

import pytest

from helpers import REPO

SCRIPT = REPO / "benchmarks/gpu.sh"


def gpu_sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=60
    )


def test_dry_run_on_8_gpus_plans_the_articles_table_first_within_the_budget_and_says_what_it_leaves_out(tmp_path):
    out = tmp_path / "bench"
    got = gpu_sh("--dry-run", "--gpus", "8", "--budget-s", "480", "--out", str(out))
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert "world sizes 1, 2, 4, 8" in lines[0] and "budget 480 s" in lines[0] and "dry run" in lines[0]
    plan = {line.split()[0]: line for line in lines if re.match(r"^  \w+ +~ *\d+ s  ", line)}
    assert list(plan) == ["table", "precision", "fsdp", "parity", "mfu"]  # in priority order
    # single 1 + dp at 2, 4, 8 + ddp at 1, 2, 4, 8 cells of 14 s, plus 10 s of start-up
    assert "~ 122 s  run      8 cells: single, dp, ddp x fp32" in plan["table"]
    assert "16 cells" in plan["precision"] and " run " in plan["precision"]
    assert "left out" in plan["fsdp"] and "needs ~178 s, ~124 s left" in got.stdout
    total = next(line for line in lines if "total" in line)
    assert "total ~436 s of 480; left out: fsdp" in total
    studies = [line for line in lines if " speedup --params " in line]
    assert [s.split("--out ")[1] for s in studies] == [f"{out}/gpu/table", f"{out}/gpu/precision"]
    writers = [line for line in lines if "yaml.safe_load" in line]
    assert "1\\,2\\,4\\,8 True single\\,dp\\,ddp fp32" in writers[0]  # sizes, strategies, precision
    assert "single\\,dp\\,ddp bf16\\,fp16" in writers[1]
    assert any("torch.__version__" in line for line in lines)  # it records the torch it runs with
    assert sum(" bench parity " in line for line in lines) == 1
    mfu = [line for line in lines if " bench mfu " in line]
    assert len(mfu) == 1 and "--device cuda --precision bf16" in mfu[0] and f"--out {out}" in mfu[0]
    assert not out.exists()  # nothing ran


def test_a_small_budget_leaves_out_what_does_not_fit_and_times_out_each_part_within_it():
    got = gpu_sh("--dry-run", "--gpus", "2", "--budget-s", "200", "--skip-parity")
    assert got.returncode == 0, got.stderr
    # 2 GPUs: table = single + dp-w2 + ddp w1, w2 = 4 cells, 66 s; precision 8 cells, 122 s; fsdp 6, 94 s
    assert "total ~188 s of 200; left out: fsdp mfu" in got.stdout
    timeouts = [int(line.split("timeout ")[1].split()[0]) for line in got.stdout.splitlines() if "+ timeout " in line]
    assert timeouts == [200, 134]  # each part may use what the parts before leave of the budget


def test_dry_run_world_sizes_end_at_the_gpu_count_and_one_gpu_says_dp_is_skipped():
    one = gpu_sh("--dry-run", "--gpus", "1")
    six = gpu_sh("--dry-run", "--gpus", "6", "--skip-parity")
    assert one.returncode == six.returncode == 0
    assert "world sizes 1, budget" in one.stdout.splitlines()[0] and "1\\,2" not in one.stdout
    assert "dp: skipped at every world size (nn.DataParallel needs >= 2 GPUs; 1 visible)" in one.stdout
    assert "world sizes 1, 2, 4, 6," in six.stdout and " bench parity " not in six.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "unknown argument '--bogus'"),
        (["--gpus", "0"], "--gpus = '0' is not a positive whole number"),
        (["--gpus", "two"], "--gpus = 'two' is not a positive whole number"),
        (["--gpus"], "--gpus needs a number"),
        (["--dry-run", "--budget-s", "0"], "--budget-s = '0' is not allowed: give a positive whole number of seconds"),
        (["--dry-run", "--budget-s", "5m"], "--budget-s = '5m' is not allowed"),
        (["--dry-run", "--cell-s", "-1"], "--cell-s = '-1' is not allowed"),
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


FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for the node's python: 2 GPUs, and every part ends at once (FAIL_PART's with exit 3)
case "$*" in
    *torch.__version__*) echo "torch 0.0-fake" ;;
    *device_count*) echo 2 ;;
    *yaml.safe_load*) touch "$4" ;;
    *"/${FAIL_PART:-none}"*) exit 3 ;;
    *) echo "ran $*" >> "$LOG" ;;
esac
"""


def test_each_part_records_how_it_ended_as_it_ends_and_a_failed_part_does_not_stop_the_rest(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    out, log = tmp_path / "bench", tmp_path / "ran.log"
    got = gpu_sh("--out", str(out), "--no-tracking", PYTHON=str(fake), FAIL_PART="precision", LOG=str(log))
    assert got.returncode == 0, got.stderr
    parts = [line.split("\t")[:2] for line in (out / "gpu/parts.tsv").read_text().splitlines()]
    assert parts == [
        ["table", "ran"],
        ["precision", "failed (exit 3)"],
        ["fsdp", "ran"],
        ["parity", "ran"],
        ["mfu", "ran"],
    ]
    assert (out / "gpu/torch.txt").read_text() == "torch 0.0-fake\n"
    ran = log.read_text()
    assert "speedup --params" in ran and "bench parity" in ran and "bench mfu" in ran
