"""The store setting: `scalelab store set/check/serve` against the real local S3 server."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from helpers import BIN
from scalelab.storage import Store, configured
from services import s3  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


def run_ok(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def init_repo(path):
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    run_ok([str(BIN / "dvc"), "init", "-q"], cwd=path)
    return path


def scalelab_store(repo, *args, env=None):
    return subprocess.run(
        [str(BIN / "scalelab"), "store", *args, "--repo", str(repo)],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_set_keeps_the_credentials_out_of_git_and_dvc_reads_the_same_store(tmp_path, s3):
    repo = init_repo(tmp_path / "clone")
    keys = {"AWS_ACCESS_KEY_ID": s3.access_key_id, "AWS_SECRET_ACCESS_KEY": s3.secret_access_key}
    proc = scalelab_store(repo, "set", "s3://scalelab/lab", "--endpoint", s3.endpoint, env=keys)
    assert proc.returncode == 0, proc.stderr
    committed = (repo / ".dvc/config").read_text()
    assert "s3://scalelab/lab" in committed and s3.secret_access_key not in committed
    local = repo / ".dvc/config.local"
    assert s3.secret_access_key in local.read_text()
    assert stat.S_IMODE(local.stat().st_mode) == 0o600
    ignored = subprocess.run(["git", "check-ignore", "-q", ".dvc/config.local"], cwd=repo)
    assert ignored.returncode == 0, ".dvc/config.local must be ignored by git"
    store = configured(repo)
    assert store == Store("s3://scalelab/lab", s3.endpoint, s3.access_key_id, s3.secret_access_key)
    assert s3.secret_access_key not in repr(store)
    (repo / "f.txt").write_text("shared\n")
    run_ok([str(BIN / "dvc"), "add", "-q", "f.txt"], cwd=repo)
    run_ok([str(BIN / "dvc"), "push", "-q"], cwd=repo)
    assert list((s3.base_path / "data/scalelab/lab/files/md5").rglob("*")), "dvc push wrote nothing to the store"


@pytest.mark.parametrize("case", ["wrong", "missing"])
def test_refused_credentials_are_one_line_and_change_nothing(tmp_path, s3, case):
    repo = init_repo(tmp_path / "clone")
    env = {"AWS_ACCESS_KEY_ID": "nobody", "AWS_SECRET_ACCESS_KEY": "wrong"} if case == "wrong" else {}
    env |= {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none")}
    if case == "missing":
        env |= {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    proc = scalelab_store(repo, "set", "s3://scalelab", "--endpoint", s3.endpoint, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "s3://scalelab" in lines[0] and s3.endpoint in lines[0], proc.stderr
    assert "wrong" not in lines[0]
    assert configured(repo) is None, "a refused store was written to the config"


def test_an_unreachable_store_is_one_line_exit_2(tmp_path, s3):
    repo = init_repo(tmp_path / "clone")
    assert scalelab_store(repo, "serve", "--base", s3.base, "--port", "1").returncode == 0  # already running: reused
    assert configured(repo).endpoint == s3.endpoint
    from scalelab.storage import server

    server.stop(s3.base)
    proc = scalelab_store(repo, "check")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be reached" in lines[0] and s3.endpoint in lines[0], proc.stderr


def test_a_shared_folder_is_a_store_too(tmp_path):
    repo = init_repo(tmp_path / "clone")
    shared = tmp_path / "shared"
    assert scalelab_store(repo, "set", str(shared)).returncode == 2  # no such folder: said, nothing written
    shared.mkdir()
    proc = scalelab_store(repo, "set", str(shared))
    assert proc.returncode == 0, proc.stderr
    assert configured(repo).url == str(shared)


def test_new_credentials_never_read_as_an_option_on_a_command_line():
    # ci20 failed `dvc remote modify --local store secret_access_key -9fH1...`: a URL-safe token
    # starts with "-" one time in 64; in 2,000 draws that would be all but certain
    from scalelab.storage.server import new_credentials

    drawn = [new_credentials() for _ in range(2000)]
    assert len({secret for _, secret in drawn}) == 2000
    for key, secret in drawn:
        assert key.startswith("scalelab-") and len(secret) == 40
        assert set(secret) <= set("0123456789abcdef"), secret
