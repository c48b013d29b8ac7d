"""A lab shares one store: clone A runs the pipeline and pushes (git to a bare remote, outputs to
the store: the real local S3 server or a shared folder); clone B, with an empty DVC cache, pulls
the same bytes and reruns nothing. Experiments travel with `dvc exp push/pull`, inputs under
data/raw with `dvc add`, a run's data and weights with `scalelab fetch`; a push cut by the
store's death completes when rerun.

Clone A (a tiny pipeline with a text corpus in data/raw, `dvc repro`, `dvc push`, `git push`) is
built once per module; the tests that change it work in a copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import BIN, copy_repo, run_cli, tiny_params, training_pipeline, wait_for
from services import s3_server

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("shared-store")]

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@e"]
PREFIX = "s3://scalelab/lab"
UP_TO_DATE = "Data and pipelines are up to date."


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run([*GIT, *args], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def keys(server) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": server.access_key_id, "AWS_SECRET_ACCESS_KEY": server.secret_access_key}


def set_store(repo: Path, url: str, server=None) -> None:
    """`scalelab store set`, as the README tells a colleague (credentials from the environment)."""
    endpoint = ["--endpoint", server.endpoint] if server else []
    run_cli("store", "set", url, *endpoint, "--repo", str(repo), cwd=repo, env=keys(server) if server else None)


def clone(bare: Path, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(bare), str(dest)], check=True)
    return dest


def outputs(repo: Path) -> dict[str, bytes]:
    """Every file that DVC tracks in `repo` (stage outputs, folders file by file, `dvc add`ed inputs)."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]  # dvc.lock keeps removed ones
    paths = [o["path"] for name in stages for o in lock[name].get("outs", [])]
    for dvc_file in (repo / "data/raw").glob("*.dvc"):  # an out's path is relative to its .dvc file
        out = yaml.safe_load(dvc_file.read_text())["outs"][0]["path"]
        paths.append((dvc_file.parent / out).relative_to(repo).as_posix())
    found = {}
    for rel in paths:
        path = repo / rel
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        found |= {f.relative_to(repo).as_posix(): f.read_bytes() for f in files}
    return found


def assert_clean(repo: Path) -> None:
    """`dvc status` and `dvc status -c` clean, and `dvc repro` reruns no stage."""
    assert run_cli("dvc", "status", cwd=repo).stdout.strip() == UP_TO_DATE
    cloud = run_cli("dvc", "status", "-c", cwd=repo).stdout.strip()
    assert cloud.startswith("Cache and remote") and cloud.endswith("are in sync."), cloud
    repro = run_cli("dvc", "repro", cwd=repo).stdout
    assert "Running stage" not in repro and UP_TO_DATE in repro, repro


def text_corpus(folder: Path) -> None:
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"part-{i}.txt").write_text(f"document {i}: the lab's own words\n" * (50 + i))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with s3_server(tmp_path_factory.mktemp("s3")) as found:
        yield found


@pytest.fixture(scope="module")
def lab(tmp_path_factory, server) -> dict[str, Path]:
    """Clone A: tiny pipeline, a text corpus added with `dvc add`, the store set, `dvc repro`,
    `dvc push`, everything committed and pushed to the bare remote `origin`."""
    tmp = tmp_path_factory.mktemp("lab")
    bare = tmp / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    a = copy_repo(tmp / "a")
    training_pipeline(a, tiny_params())
    text_corpus(a / "data/raw/corpus")
    run_cli("dvc", "add", "-q", "data/raw/corpus", cwd=a)
    set_store(a, PREFIX, server)
    git(a, "add", "-A")
    git(a, "commit", "-qm", "tiny pipeline, a corpus, the lab's store")
    run_cli("dvc", "repro", cwd=a, timeout=900)
    run_cli("dvc", "push", cwd=a)
    git(a, "add", "-A")
    git(a, "commit", "-qm", "results")
    git(a, "remote", "add", "origin", str(bare))
    git(a, "push", "-q", "origin", "main")
    return {"a": a, "bare": bare, "tmp": tmp}


@pytest.mark.parametrize("kind", ["s3", "folder"])
def test_a_pulled_clone_has_every_output_and_reruns_nothing(lab, server, tmp_path, kind):
    a = lab["a"]
    assert (a / "data/raw/corpus.dvc").is_file() and not git(a, "status", "--porcelain").strip()
    assert git(a, "check-ignore", "results/train/checkpoints/x").strip(), "checkpoints are a working folder"
    if kind == "folder":  # the lab's store is a folder on a shared filesystem instead
        shared = tmp_path / "shared"
        shared.mkdir()
        run_cli("dvc", "remote", "add", "--local", "shared", str(shared), cwd=a)
        run_cli("dvc", "push", "-r", "shared", cwd=a)
    b = clone(lab["bare"], tmp_path / "b")
    set_store(b, str(tmp_path / "shared") if kind == "folder" else PREFIX, None if kind == "folder" else server)
    assert not (b / ".dvc/cache").exists()
    run_cli("dvc", "pull", cwd=b)
    expected = outputs(a)
    assert {"results/validate.json", "results/train/model.pt", "data/raw/corpus/part-0.txt"} <= set(expected)
    assert outputs(b) == expected
    assert_clean(b)


def test_an_experiment_travels_through_git_and_the_store(lab, server, tmp_path):
    a = tmp_path / "a"
    shutil.copytree(lab["a"], a, symlinks=True)
    run_cli("dvc", "exp", "run", "-n", "e1", "-S", "train.lr=0.002", cwd=a, timeout=900)
    run_cli("dvc", "exp", "push", "origin", "e1", cwd=a)
    run_id = json.loads((a / "results/train/run.json").read_text())["run_id"]
    from mlflow import MlflowClient

    run = MlflowClient(f"sqlite:///{a / 'mlflow.db'}").get_run(run_id)
    assert run.data.tags.get("dvc.exp_name") == "e1" and run.data.params["train.lr"] == "0.002"

    b = clone(lab["bare"], tmp_path / "b")
    set_store(b, PREFIX, server)
    run_cli("dvc", "exp", "pull", "origin", "e1", cwd=b)
    run_cli("dvc", "exp", "apply", "e1", cwd=b)
    run_cli("dvc", "pull", cwd=b)
    assert (b / "results/train/model.pt").read_bytes() == (a / "results/train/model.pt").read_bytes()
    assert json.loads((b / "results/train/run.json").read_text())["run_id"] == run_id
    assert yaml.safe_load((b / "params.yaml").read_text())["train"]["lr"] == 0.002


def test_fetch_brings_back_a_runs_data_and_weights_checked(lab, server, tmp_path):
    a = lab["a"]
    run_id = json.loads((a / "results/train/run.json").read_text())["run_id"]
    c = clone(lab["bare"], tmp_path / "c")  # another machine: an empty cache, the lab's tracking store
    set_store(c, PREFIX, server)
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{a / 'mlflow.db'}"}
    out = tmp_path / "fetched"
    proc = run_cli("fetch", run_id, "--out", str(out), cwd=c, env=env)
    assert run_id in proc.stdout
    for name in ("model.pt", "best.pt"):
        assert (out / name).read_bytes() == (a / "results/train" / name).read_bytes()
    data = sorted(p.relative_to(out) for p in (out / "data/prepared").rglob("*") if p.is_file())
    assert data and data == sorted(p.relative_to(a) for p in (a / "data/prepared").rglob("*") if p.is_file())
    assert all((out / p).read_bytes() == (a / p).read_bytes() for p in data)

    unknown = run_cli("fetch", "0" * 32, "--out", str(tmp_path / "x"), cwd=c, env=env, check=False)
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    assert "0" * 32 in unknown.stderr and not (tmp_path / "x").exists()

    shared = tmp_path / "shared"  # the same objects in a shared folder, model.pt's changed by one byte
    shutil.copytree(server.base_path / "data/scalelab/lab", shared)
    md5 = hashlib.md5((a / "results/train/model.pt").read_bytes()).hexdigest()
    tampered = shared / "files/md5" / md5[:2] / md5[2:]
    tampered.write_bytes(tampered.read_bytes()[:-1] + bytes([tampered.read_bytes()[-1] ^ 1]))
    set_store(c, str(shared))
    bad = run_cli("fetch", run_id, "--out", str(tmp_path / "z"), cwd=c, env=env, check=False)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    [line] = bad.stderr.strip().splitlines()
    assert "model.pt" in line and md5 in line and "not kept" in line, line
    assert not (tmp_path / "z/model.pt").exists() and not list((tmp_path / "z").glob(".model.pt*"))

    set_store(c, "s3://scalelab/empty", server)  # a store that never got this run's objects
    empty = run_cli("fetch", run_id, "--out", str(tmp_path / "y"), cwd=c, env=env, check=False)
    assert empty.returncode == 2, empty.stdout + empty.stderr
    [line] = empty.stderr.strip().splitlines()
    assert "s3://scalelab/empty" in line and "has no object" in line, line


def test_a_push_cut_by_the_stores_death_completes_when_rerun(tmp_path):
    base = tmp_path / "s3"
    a = tmp_path / "a"
    a.mkdir()
    git(a, "init", "-q", "-b", "main")
    run_cli("dvc", "init", "-q", cwd=a)
    big = a / "big"
    big.mkdir()
    for i in range(2):  # 2 objects of 32 MiB: the store dies while the first one is on its way
        (big / f"{i}.bin").write_bytes(os.urandom(32 << 20))
    run_cli("dvc", "add", "-q", "big", cwd=a)
    with s3_server(base) as first:
        set_store(a, PREFIX, first)
        port, creds = first.endpoint.rsplit(":", 1)[1], (first.access_key_id, first.secret_access_key)
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
        push_log = tmp_path / "push.log"
        with open(push_log, "wb") as log:
            push = subprocess.Popen(
                [str(BIN / "dvc"), "push", "-j", "2"], cwd=a, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        objects = base / "data/scalelab/lab/files/md5"
        wait_for(
            lambda: objects.is_dir() and any(objects.rglob("*")),
            120,
            "the push's first object folder in the store",
            push,
            log=push_log,
            poll_s=0.05,
        )
        os.killpg(first.pid, signal.SIGKILL)  # the store dies mid-push (an object's folder, no object yet)
        push.wait(timeout=300)
        out = push_log.read_text()
    assert push.returncode != 0, out
    failed = [line for line in out.splitlines() if line.startswith("ERROR: failed to transfer")]
    assert failed and all(f"{first.endpoint}/scalelab/lab/files/md5/" in line for line in failed), out
    for path in objects.rglob("*"):  # what the store holds under an object's name is that object, whole
        if path.is_file() and not path.name.startswith("."):
            assert hashlib.md5(path.read_bytes()).hexdigest() == path.parent.name + path.name, path
    from scalelab.storage import server as store_server

    store_server.stop(base)
    restarted = store_server.start(base, int(port), credentials=creds)  # same credentials, same folder
    try:
        run_cli("dvc", "push", cwd=a)
        git(a, "add", "-A")
        git(a, "commit", "-qm", "big")
        b = clone(a, tmp_path / "b")
        set_store(b, PREFIX, restarted)
        run_cli("dvc", "pull", cwd=b)
        for path in sorted(big.iterdir()):
            assert (b / "big" / path.name).read_bytes() == path.read_bytes(), path.name
    finally:
        store_server.stop(base)
