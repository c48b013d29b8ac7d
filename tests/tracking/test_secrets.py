"""Nothing secret reaches the store: secret-named untracked files are never read, and every
uploaded diff, command line and tag is redacted, with the count recorded."""

import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from helpers import run_cli, tiny_params, write_params
from scalelab.tracking.secrets import is_secret_file, mask_uri, redact

SECRET = "hunter2-S3cr3t-xyz"


@pytest.mark.parametrize(
    "text, expected",
    [
        (f"MLFLOW_TRACKING_PASSWORD={SECRET}", "MLFLOW_TRACKING_PASSWORD=***"),
        (f'+    password = "{SECRET}"', '+    password = "***"'),
        (f"http://alice:{SECRET}@host:5000/api", "http://alice:***@host:5000/api"),
        ("http://alice:p@ss@host/x", "http://alice:***@host/x"),  # an '@' inside the password
        ("aws AKIAABCDEFGHIJKLMNOP key", "aws *** key"),
        ("gcp AIza" + "A" * 35, "gcp ***"),
        ("gh ghp_" + "a" * 36, "gh ***"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", "***"),
        ("api_token: abc123def", "api_token: ***"),
    ],
)
def test_credentials_are_redacted(text, expected):
    assert redact(text) == (expected, 1)


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens=100",
        "token = tokenizer(x)",
        "tokenizers==0.19.1",
        "use_token: true",
        "lr=0.003",
        "      tokenizer: bytes",  # params data.text in dvc.lock: a setting, and YAML that must stay YAML
    ],
)
def test_settings_and_code_are_left_alone(text):
    assert redact(text) == (text, 0)


def test_secret_file_names_and_uri_masks():
    assert all(
        map(
            is_secret_file,
            [
                ".env",
                "conf/.env.local",
                "id_rsa",
                "a/server.pem",
                "x.key",
                "gcp-credentials.json",
                "my_token.txt",
                ".netrc",
                "db_secret.yaml",
            ],
        )
    )
    assert not any(map(is_secret_file, ["train.py", "params.yaml", "data/raw/t.csv"]))
    assert mask_uri("postgresql://u:pw@db/x") == "postgresql://u:***@db/x"


@pytest.mark.slow  # prepare and a training job in a copy of the repo
@pytest.mark.integration
def test_a_run_with_an_untracked_env_file_holds_the_secret_nowhere(repo_copy, tmp_path):
    write_params(repo_copy / "params.yaml", tiny_params(train={"epochs": 1}))
    (repo_copy / ".env").write_text(f"MLFLOW_TRACKING_PASSWORD={SECRET}\n")  # git-ignored secret file
    (repo_copy / "deploy_token.txt").write_text(f"{SECRET}\n")  # not ignored, but named like a secret
    (repo_copy / "notes.txt").write_text(f"db password={SECRET}\n")  # untracked, uploaded
    with (repo_copy / "experiments/mlp.py").open("a") as fh:  # tracked change
        fh.write(f'\nAPI_TOKEN = "{SECRET}"\n')
    run_cli("prepare", "--out", "data/prepared", cwd=repo_copy)
    run_cli(
        "train", "--data", "data/prepared", "--out", "results/train", cwd=repo_copy, env={"EXTRA_ARG_PASSWORD": SECRET}
    )
    client = MlflowClient(f"sqlite:///{repo_copy / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])[0]
    seen = [*run.data.params.values(), *run.data.params, *run.data.tags.values(), *run.data.tags]
    assert not [v for v in seen if SECRET in str(v)]
    assert int(run.data.tags["provenance.redactions"]) >= 2  # notes.txt and mlp.py
    assert run.data.tags["git.untracked_secret_files_skipped"] == "1"
    local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts")))
    files = [p for p in local.rglob("*") if p.is_file()]
    assert any(p.name == "untracked.diff" for p in files) and any(p.name == "dirty.diff" for p in files)
    assert not [p for p in files if SECRET.encode() in p.read_bytes()]
    untracked = next(p for p in files if p.name == "untracked.diff").read_text()
    assert ".env" not in untracked and "deploy_token" not in untracked and "notes.txt" in untracked
    assert "password=***" in untracked
    assert (
        ".env" in subprocess.run(["git", "check-ignore", ".env"], cwd=repo_copy, capture_output=True, text=True).stdout
    )  # and .gitignore ignores it from now on
