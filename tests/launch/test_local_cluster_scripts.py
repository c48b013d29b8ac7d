"""The local-cluster scripts run as root: they refuse a state folder that another user made first
(or a symlink planted in its place), and they stop only the daemon a pid file names (issue 32)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import REPO

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the scripts run as root; the attack needs a second user (chown)"),
]
COMMON = REPO / "slurm/local/common.sh"
NOBODY = 65534


def bash(script: str, state: os.PathLike) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f'set -euo pipefail; source "{COMMON}" "{state}"; {script}'],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_start_refuses_a_state_folder_made_by_another_user_and_writes_nothing_there(tmp_path):
    planted = tmp_path / "scalelab-slurm"
    planted.mkdir()
    os.chown(planted, NOBODY, NOBODY)
    proc = subprocess.run(
        [str(REPO / "slurm/local/start.sh"), str(planted)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert "refusing state dir" in proc.stderr and "uid 65534" in proc.stderr, proc.stderr
    assert list(planted.iterdir()) == [], "start.sh wrote into a folder it does not own"


def test_a_symlink_in_place_of_the_state_folder_is_refused(tmp_path):
    target = tmp_path / "root-owned"
    target.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(target)
    proc = bash("own_state_dir create", tmp_path / "link")
    assert proc.returncode == 2 and "not a plain folder" in proc.stderr, proc.stderr
    assert oct(target.stat().st_mode & 0o777) == oct(0o755), "the symlink's target was chmodded"


def test_an_own_folder_is_created_closed_to_others(tmp_path):
    state = tmp_path / "state"
    assert bash("own_state_dir create", state).returncode == 0
    assert state.stat().st_mode & 0o777 == 0o700 and state.stat().st_uid == 0


def test_stop_pidfile_leaves_a_process_that_is_not_the_daemon_alive(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "slurmd.pid").write_text(f"{victim.pid}\n")
        proc = bash(f'stop_pidfile "slurmd n1" "{tmp_path}/slurmd.pid" slurmd', tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert victim.poll() is None, "stop_pidfile killed a process that is not slurmd"
        assert "not stopping pid" in proc.stderr, proc.stderr
    finally:
        victim.kill()
        victim.wait()
