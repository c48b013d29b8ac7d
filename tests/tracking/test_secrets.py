"""Nothing secret reaches the store, and nothing innocent is changed: secrets are recognised by
their form (a generated corpus of realistic fakes against innocent look-alikes from this
repository), a stored diff is never edited (stored byte for byte, or not at all with the run tagged
not reproducible), and secret-named untracked files are never read."""

import hashlib
import random
import string
import subprocess
from pathlib import Path

import pytest
from mlflow import MlflowClient

from helpers import REPO, run_cli, tiny_params, write_params
from scalelab.tracking.provenance import git_info, scrub
from scalelab.tracking.secrets import MASK, diff_findings, find, is_secret_file, mask_uri, redact

SECRET = "hunter2-S3cr3t-xyz"
RNG = random.Random(31)


def rand(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    while True:  # a fake with at least one digit, as real random tokens have
        out = "".join(RNG.choice(alphabet) for _ in range(n))
        if any(c.isdigit() for c in out):
            return out


B64 = string.ascii_letters + string.digits + "+/"
HEX = "0123456789abcdef"
PEM_BODY = "\n".join(rand(64, B64) for _ in range(3))
# (text, the secret in it): realistic fakes of every form the scan knows, generated here
SECRETS = [
    *[(f"aws_access_key_id = {k}", k) for k in ("AKIA" + rand(16, string.ascii_uppercase + "234567"),)],
    ("key ASIA" + (k := rand(16, string.ascii_uppercase + "234567")), "ASIA" + k),
    (f"aws_secret_access_key = {(k := rand(40, B64))}", k),
    (f"GOOGLE_API_KEY: AIza{(k := rand(35))}", f"AIza{k}"),
    (f"git clone with ghp_{(k := rand(36))}", f"ghp_{k}"),
    (f"gho_{(k := rand(36))}", f"gho_{k}"),
    (f"GH_TOKEN=github_pat_{(k := rand(82, string.ascii_letters + string.digits + '_'))}", f"github_pat_{k}"),
    (f"CI_JOB glpat-{(k := rand(20))}", f"glpat-{k}"),
    (f"huggingface-cli login --token hf_{(k := rand(34))}", f"hf_{k}"),
    (f'HF_TOKEN="hf_{(k := rand(34))}"', f"hf_{k}"),
    (f"slack xoxb-{(k := rand(12, string.digits))}-{rand(24)}", f"xoxb-{k}"),
    (f"xoxp-{(k := rand(40))}", f"xoxp-{k}"),
    (f"webhook: https://hooks.slack.com/services/T{(k := rand(30))}", f"T{k}"),
    (f"//registry.npmjs.org/:_authToken=npm_{(k := rand(36))}", f"npm_{k}"),
    (f"password = pypi-AgEIcHlwaS5vcmc{(k := rand(60))}", k),
    (f'OPENAI_API_KEY="sk-{(k := rand(48))}"', f"sk-{k}"),
    (f"client = OpenAI(api_key='sk-proj-{(k := rand(40))}')", f"sk-proj-{k}"),
    (f"stripe sk_live_{(k := rand(24))}", f"sk_live_{k}"),
    (f"jwt eyJ{(k := rand(20))}.eyJ{rand(30)}.{rand(43)}", f"eyJ{k}"),
    (f"curl -H 'Authorization: Bearer {(k := rand(40))}' https://api", k),
    (f"DefaultEndpointsProtocol=https;AccountName=lab;AccountKey={(k := rand(86, B64))}==;", k),
    (f"azure account_key: {(k := rand(64, B64))}", k),
    (f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----", PEM_BODY),
    (f"-----BEGIN PRIVATE KEY-----\n{(k := rand(64, B64))}\n", k),  # no END line
    (f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{(k := rand(64, B64))}\n=ab12\n", k),
    (f"-----BEGIN OPENSSH PRIVATE KEY-----\n{(k := rand(70, B64))}\n-----END OPENSSH PRIVATE KEY-----", k),
    (f"-----BEGIN EC PRIVATE KEY-----\n{(k := rand(64, B64))}", k),
    ("MLFLOW_TRACKING_URI=http://alice:Zx/9+aB@login1:5000", "Zx/9+aB"),  # a '/' in the password
    ("sweep.storage: postgresql://bob:p[a]ss]w0rd@db:5432/optuna", "p[a]ss]w0rd"),  # brackets
    ("http://alice:p@ss@host/x", "p@ss"),  # an '@' in the password
    (f"https://{(k := rand(40))}@github.com/lab/repo.git", k),  # a token as the user
    ("redis://:s3cretPass99@cache:6379/0", "s3cretPass99"),
    ("mysql --password 'Hunter2!x' -u root", "Hunter2!x"),
    (f"scalelab train --api-key={(k := rand(32, HEX))}", k),
    ("DB_PASSWORD=correct-horse-9", "correct-horse-9"),  # .env
    ("MLFLOW_TRACKING_PASSWORD=hunter2", "hunter2"),  # .env: a bare word
    (f"PGPASSWORD={SECRET} psql", SECRET),
    ('  password: "p4ss-w0rd!"', "p4ss-w0rd!"),
    (f'{{"client_secret": "{(k := rand(34))}"}}', k),
    (f'api_key = "{(k := rand(24))}"', k),
    ("secret_key: 'django-insecure-9x#k2$m!q'", "django-insecure-9x#k2$m!q"),
    (f"github_token: {(k := rand(40, HEX))}", k),  # a classic 40-hex token under a token key
    (f'+    password = "{SECRET}"', SECRET),
]
# innocent look-alikes: this repository's params and pipeline files (comments included), dvc.lock's
# hashes, and code and docs that name secrets without holding one
INNOCENT = [
    *(REPO / "params.yaml").read_text().splitlines(),
    *(REPO / "dvc.yaml").read_text().splitlines(),
    *(REPO / "dvc.lock").read_text().splitlines()[:60],
    "  workload: mlp                 # a module in experiments/: mlp | cnn (features) | gpt (tokens: data.source text)",
    "token = self_tok",
    "secret: bool = False",
    "max_tokens=100",
    "tokens_per_s = num_tokens / elapsed_s",
    "token = tokenizer(x)",
    "tokenizers==0.19.1",
    "use_token: true",
    "      tokenizer: bytes",
    'password = os.environ["PGPASSWORD"]',
    "password = getpass.getpass()",
    "secret_key = secrets.token_hex(16)",
    "api_key=None",
    "if token is None:",
    'env = {"MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD}',
    "MLFLOW_TRACKING_PASSWORD=${MLFLOW_TRACKING_PASSWORD}",
    "password: <your password>",
    "sweep.storage: postgresql://user:password@host/db",
    "MLFLOW_TRACKING_URI=http://127.0.0.1:5000/api/2.0/mlflow",
    "http://localhost:5000/#/experiments/1@runs",
    "git.commit: 81baee6d0c4bd3a2f1a3c91e5a8f6b0e6c1d2e3f",
    "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "rev: 0123456789abcdef0123456789abcdef01234567",
    "hf_hub_download(repo_id=name)",
    "pip install scikit-learn  # sk-learn",
    "Bearer tokens in headers are masked",
    "-----BEGIN CERTIFICATE-----",
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC user@host",
    "git@github.com:lab/scalelab.git",
    "AUTH=basic",
    "password_file: /run/secrets/db",
    "secret: /run/secrets/pw",
    "token_count: 12",
    "scalelab sample --tokens 50 --temperature 0.8",
    "--token-file ~/.hf_token",
    "lr=0.003",
    "num_heads: 4  # attention heads (tokens attend to tokens)",
]


@pytest.mark.parametrize("text, secret", SECRETS, ids=[f"secret{i}" for i in range(len(SECRETS))])
def test_every_realistic_secret_is_found_and_masked(text, secret):
    masked, count = redact(text)
    assert count >= 1 and secret not in masked and MASK in masked, masked


def test_the_corpora_are_large_enough():
    assert len(SECRETS) >= 40 and len([line for line in INNOCENT if line.strip()]) >= 40


def test_no_innocent_line_is_changed():
    changed = [line for line in INNOCENT if redact(line) != (line, 0)]
    assert not changed, changed


def test_a_finding_names_its_line_and_rule():
    text = "a = 1\nb = 2\nGH=ghp_" + "a1" * 18 + "\n"
    (finding,) = find(text)
    assert (finding.line, finding.rule) == (3, "github-token") and text[finding.start : finding.end].startswith("ghp_")


DIFF = """diff --git a/experiments/mlp.py b/experiments/mlp.py
index 1111111..2222222 100644
--- a/experiments/mlp.py
+++ b/experiments/mlp.py
@@ -10,3 +10,4 @@ class Config:
 TOKEN_HELP = "hf_{context}"
 x = 1
+API_TOKEN = "{added}"
 y = 2
diff --git a/.env.local b/.env.local
new file mode 100644
--- /dev/null
+++ b/.env.local
@@ -0,0 +1 @@
+DEBUG=1
"""


def test_a_diff_finding_names_the_file_and_its_line_and_context_lines_are_not_read():
    context, added = "hf_" + rand(34), "ghp_" + rand(36)
    found = diff_findings(DIFF.format(context=context, added=added))
    assert [(f.path, f.line, f.rule) for f in found] == [
        (".env.local", 0, "secret file name"),
        ("experiments/mlp.py", 12, "github-token"),
    ]
    assert str(found[1]) == "experiments/mlp.py line 12 (github-token)"


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=repo, check=True)


@pytest.fixture
def shipped_params_repo(tmp_path: Path) -> Path:
    """A git repository holding this repository's params.yaml, comments and all."""
    (tmp_path / "params.yaml").write_bytes((REPO / "params.yaml").read_bytes())
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "params")
    return tmp_path


def test_a_params_change_beside_the_shipped_comments_is_stored_byte_for_byte(shipped_params_repo):
    """What `dvc exp run -S train.model.hidden=[64]` leaves: a diff whose context holds the comment
    `(tokens: data.source text)`, which a redactor once rewrote (and `git apply` then refused)."""
    params = shipped_params_repo / "params.yaml"
    params.write_text(params.read_text().replace("hidden: [256, 256]", "hidden: [64]"))
    tags, texts = git_info(shipped_params_repo)
    raw = texts["provenance/dirty.diff"]
    assert b"(tokens: data.source text)" in raw  # the comment is in the diff's context
    out_tags, out_texts = scrub(tags, texts)
    assert out_texts["provenance/dirty.diff"] == raw
    assert out_tags["provenance.dirty.diff.sha256"] == hashlib.sha256(raw).hexdigest()
    assert out_tags["scalelab.reproducible"] == "true" and out_tags["provenance.redactions"] == "0"


def test_a_secret_in_the_uncommitted_changes_stores_no_diff_and_marks_the_run_not_reproducible(shipped_params_repo):
    params = shipped_params_repo / "params.yaml"
    token = "hf_" + rand(34)
    params.write_text(params.read_text() + f"  hub_token: {token}\n")  # in the last section, sweep
    (shipped_params_repo / "notes.txt").write_text("nothing here\n")
    out_tags, out_texts = scrub(*git_info(shipped_params_repo, untracked_contents=True))  # tracking.upload_untracked
    assert "provenance/dirty.diff" not in out_texts and out_texts["provenance/untracked.diff"]
    line = len(params.read_text().splitlines())
    assert out_tags["provenance.dirty.diff.withheld"] == f"a secret at params.yaml line {line} (huggingface-token)"
    assert out_tags["scalelab.reproducible"] == "false"
    assert f"params.yaml line {line}" in out_tags["scalelab.not_reproducible"]
    assert token not in str(out_tags) and "provenance.dirty.diff.sha256" not in out_tags


def test_secret_file_names_and_uri_masks():
    named = [".env", "conf/.env.local", "id_rsa", "a/server.pem", "x.key", "gcp-credentials.json", "my_token.txt"]
    named += [".netrc", "db_secret.yaml", "kaggle.json", ".pypirc", ".npmrc", "service-account.json"]
    named += ["prod.tfvars", "my.cnf", "creds.yaml"]
    assert [p for p in named if not is_secret_file(p)] == []
    assert not any(map(is_secret_file, ["train.py", "params.yaml", "data/raw/t.csv", "a.npy"]))
    assert mask_uri("postgresql://u:pw@db/x") == "postgresql://u:***@db/x"
    assert mask_uri("http://alice:Zx/9+aB@login1:5000") == "http://alice:***@login1:5000"


@pytest.mark.slow  # prepare and a training job in a copy of the repo
@pytest.mark.integration
def test_a_run_with_secrets_in_its_changes_holds_them_nowhere_and_cannot_be_reproduced(repo_copy, tmp_path):
    storage = f"postgresql://optuna:{SECRET}@db.lab:5432/optuna"  # the README's sweep.storage form
    untracked = {"upload_untracked": True}  # opted in: the untracked notes.txt is read, and its secret found
    write_params(
        repo_copy / "params.yaml", tiny_params(train={"epochs": 1}, sweep={"storage": storage}, tracking=untracked)
    )
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qam", "tiny"], cwd=repo_copy)
    (repo_copy / ".env").write_text(f"MLFLOW_TRACKING_PASSWORD={SECRET}\n")  # git-ignored secret file
    (repo_copy / "deploy_token.txt").write_text(f"{SECRET}\n")  # not ignored, but named like a secret
    (repo_copy / "notes.txt").write_text(f"db password={SECRET}\n")  # untracked: a secret at line 1
    mlp = repo_copy / "experiments/mlp.py"
    mlp.write_text(mlp.read_text() + f'\nAPI_TOKEN = "{SECRET}"\n')  # a tracked change
    line = len(mlp.read_text().splitlines())
    run_cli("prepare", "--out", "data/prepared", cwd=repo_copy)
    job = run_cli(
        "train", "--data", "data/prepared", "--out", "results/train", cwd=repo_copy, env={"EXTRA_ARG_PASSWORD": SECRET}
    )
    warned = [w for w in job.stderr.splitlines() if "will not be reproducible" in w]
    assert len(warned) == 1 and f"experiments/mlp.py line {line}" in warned[0], job.stderr[-3000:]
    assert "notes.txt line 1" in warned[0] and SECRET not in job.stderr

    client = MlflowClient(f"sqlite:///{repo_copy / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])[0]
    seen = [*run.data.params.values(), *run.data.params, *run.data.tags.values(), *run.data.tags]
    assert not [v for v in seen if SECRET in str(v)]
    assert run.data.params["sweep.storage"] == "postgresql://optuna:***@db.lab:5432/optuna"
    tags = run.data.tags
    assert tags["scalelab.reproducible"] == "false" and tags["git.untracked_secret_files_skipped"] == "1"
    assert tags["provenance.dirty.diff.withheld"].startswith(f"a secret at experiments/mlp.py line {line}")
    assert tags["provenance.untracked.diff.withheld"].startswith("a secret at notes.txt line 1")
    local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts")))
    files = [p for p in local.rglob("*") if p.is_file()]
    assert not [p for p in files if p.name.endswith(".diff")] and files
    assert not [p for p in files if SECRET.encode() in p.read_bytes()]
    assert (
        ".env" in subprocess.run(["git", "check-ignore", ".env"], cwd=repo_copy, capture_output=True, text=True).stdout
    )  # and .gitignore ignores it from now on

    refused = run_cli("reproduce", run.info.run_id, "--yes", cwd=repo_copy, check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "tagged not reproducible" in refused.stderr and "experiments/mlp.py line" in refused.stderr
