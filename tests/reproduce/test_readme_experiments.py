"""Every `dvc exp run` command the README shows, run on the shipped params.yaml (its comments
included), makes a run that `scalelab reproduce` matches.

DVC rewrites params.yaml on any `-S`, so each experiment's run is dirty and its diff travels with it;
a stored diff is applied by reproduce as it was recorded (a redactor that edited a comment in it,
`tokens: data.source text`, made every such reproduce fail). The only change to the shipped file is
`train.epochs` (30 -> 2, by text substitution, so every comment stays), and the commands name the
`evaluate` stage as their target: the speedup study makes no training run.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from helpers import REPO, copy_repo, run_cli, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("dvc-experiments")]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@e"]


def readme_experiments() -> list[list[str]]:
    """The arguments of every `dvc exp run` command in the README's code blocks (continuation lines
    joined, comments cut), in the README's order."""
    commands, inline = [], []
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        if line.strip().startswith("dvc exp run"):
            commands.append(shlex.split(line, comments=True)[3:])
    for text in re.findall(r"`(dvc exp run [^`]+)`", (REPO / "README.md").read_text()):
        inline.append(shlex.split(text)[3:])  # prose: `dvc exp run -S train.profile.enabled=true`
    unique = []
    for args in commands + inline:
        if args not in unique:
            unique.append(args)
    return unique


def small_corpus(folder: Path, num_files: int = 12) -> None:
    """The README's gpt corpus (Python's standard library), cut to the smallest files that fill
    three splits: the command is the README's, the data seconds of work."""
    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("[m-s]*.py"), key=lambda p: p.stat().st_size)
    folder.mkdir(parents=True)
    for path in [p for p in stdlib if p.stat().st_size > 4000][:num_files]:
        shutil.copy(path, folder / path.name)


def test_every_readme_experiment_reproduces(tmp_path):
    experiments = readme_experiments()
    flat = [" ".join(a) for a in experiments]
    assert len(experiments) >= 6 and any("train.workload=gpt" in a for a in flat), flat  # the parse found them

    repo = copy_repo(tmp_path / "repo")
    shipped = (repo / "params.yaml").read_text()
    shortened = re.sub(r"(?m)^(  epochs: )30\b", r"\g<1>2", shipped)
    assert shortened != shipped and "tokens: data.source text" in shortened  # the comment that broke it
    (repo / "params.yaml").write_text(shortened)
    subprocess.run([*GIT, "commit", "-qam", "2 epochs"], cwd=repo, check=True)
    small_corpus(repo / "data/raw/stdlib")
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")

    runs: dict[str, str] = {}  # run id -> the command that made it
    queued = []
    for args in experiments:
        started = time.monotonic()
        subprocess.run(["git", "checkout", "--", "params.yaml", "dvc.lock"], cwd=repo, check=True)
        run_cli("dvc", "exp", "run", *args, "evaluate", cwd=repo, timeout=900)
        if "--queue" in args:
            queued.append(args[args.index("-n") + 1])
            continue
        run_id = json.loads((repo / "results/train/run.json").read_text())["run_id"]
        if run_id not in runs:  # DVC's run cache may bring back an earlier run with the same params
            runs[run_id] = " ".join(args)
            reproduce(repo, run_id, client, runs[run_id])  # now, while the workspace holds its data
        print(f"{' '.join(args)}: {time.monotonic() - started:.0f} s")  # shown with pytest -rP
    if queued:
        run_cli("dvc", "queue", "start", "-j", "2", cwd=repo)
        status = lambda: run_cli("dvc", "queue", "status", cwd=repo).stdout  # noqa: E731
        wait_for(lambda: "Queued" not in status() and "Running" not in status(), 900, "the queue", poll_s=3)
        assert status().count("Success") == len(queued), status()
        for name in queued:  # the workspace holds the digits data they trained on
            (run,) = client.search_runs(
                [client.get_experiment_by_name("scalelab").experiment_id],
                f"tags.`dvc.exp_name` = '{name}' and tags.`scalelab.kind` = 'train'",
            )
            reproduce(repo, run.info.run_id, client, f"queued {name}")
    assert len(runs) + len(queued) >= 5, runs  # distinct training runs, each reproduced


def reproduce(repo: Path, run_id: str, client: MlflowClient, what: str) -> None:
    tags = client.get_run(run_id).data.tags
    assert tags["scalelab.reproducible"] == "true", (what, tags.get("scalelab.not_reproducible"))
    assert tags["provenance.redactions"] == "0", what  # nothing here is a secret
    proc = run_cli("reproduce", run_id, "--yes", cwd=repo, check=False, timeout=900)
    assert proc.returncode == 0 and "RESULT: match" in proc.stdout, (
        f"{what}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    )
