"""A clone points at the lab's tracking server from its git-ignored .scalelab.local.yaml: the one
place the store is chosen (`tracking_uri`), with MLFLOW_TRACKING_URI > .scalelab.local.yaml >
mlflow.db, and a malformed file refused in one line (exit 2) before anything starts."""

import subprocess

import pytest

from helpers import REPO, run_cli, tiny_params, write_params
from scalelab.tracking import tracking_uri
from scalelab.tracking.tracker import LOCAL_FILE, LocalFileError


@pytest.fixture
def clone(tmp_path, monkeypatch):
    """A folder with a dvc.yaml marker, the workspace and main repository of every command here."""
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.setenv("SCALELAB_REPO", str(tmp_path))
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def test_precedence_is_environment_then_local_file_then_mlflow_db(clone, monkeypatch):
    assert tracking_uri() == f"sqlite:///{clone / 'mlflow.db'}"
    (clone / LOCAL_FILE).write_text("tracking_uri: http://login01:5000/\n")
    assert tracking_uri() == "http://login01:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://other:5001")
    assert tracking_uri() == "http://other:5001"
    (clone / LOCAL_FILE).write_text("# nothing set yet\n")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking_uri() == f"sqlite:///{clone / 'mlflow.db'}"  # an empty file: the default


@pytest.mark.parametrize(
    "text, says",
    [
        ("tracking_uri: [http://a:5000\n", "cannot be read as YAML"),
        ("- http://a:5000\n", "is not a mapping"),
        ("tracking_uri: http://a:5000\ntrackinguri: x\n", "unknown key 'trackinguri'"),
        ("tracking_uri: sqlite:///tmp/m.db\n", "tracking_uri = 'sqlite:///tmp/m.db' is not allowed"),
        ("tracking_uri: 5000\n", "tracking_uri = '5000' is not allowed"),
        ("tracking_uri: http://\n", "tracking_uri = 'http://' is not allowed"),
    ],
)
def test_a_malformed_local_file_names_the_file_the_key_the_value_and_what_is_allowed(clone, text, says):
    (clone / LOCAL_FILE).write_text(text)
    with pytest.raises(LocalFileError) as info:
        tracking_uri()
    message = str(info.value)
    assert str(clone / LOCAL_FILE) in message and says in message, message
    assert "an http:// or https:// URL" in message and "\n" not in message, message


def test_a_password_in_the_local_file_is_never_echoed(clone):
    (clone / LOCAL_FILE).write_text("tracking_uri: ftp://alice:Hunter2-secret@login01:5000\n")
    with pytest.raises(LocalFileError) as info:
        tracking_uri()
    assert "Hunter2-secret" not in str(info.value), info.value


def test_a_command_with_a_malformed_local_file_exits_2_with_one_line(clone):
    (clone / LOCAL_FILE).write_text("tracking_url: http://login01:5000\n")
    proc = run_cli("summary", cwd=clone, check=False, env={"SCALELAB_REPO": str(clone)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith(f"scalelab summary: error: {clone / LOCAL_FILE}: unknown key 'tracking_url'"), lines


@pytest.mark.integration  # a training job's launcher (imports torch)
def test_a_training_job_with_a_malformed_local_file_exits_2_before_it_starts(clone, prepared_digits):
    (clone / LOCAL_FILE).write_text("tracking_uri: sqlite:///elsewhere.db\n")
    write_params(clone / "params.yaml", tiny_params())
    args = ["train", "--params", "params.yaml", "--data", str(prepared_digits), "--out", "out"]
    proc = run_cli(*args, cwd=clone, check=False, env={"SCALELAB_REPO": str(clone)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith(f"scalelab train: error: {clone / LOCAL_FILE}: tracking_uri = "), lines
    assert not (clone / "out").exists() and not (clone / "mlflow.db").exists()  # nothing started


def test_the_local_file_is_ignored_by_git():
    proc = subprocess.run(["git", "check-ignore", "-q", LOCAL_FILE], cwd=REPO)
    assert proc.returncode == 0, f"{LOCAL_FILE} must be ignored by git: it is one clone's setting"
