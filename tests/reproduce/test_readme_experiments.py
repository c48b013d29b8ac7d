"""Every `dvc exp run` command the README shows, run on the shipped params.yaml (its comments
included), makes a run that `scalelab reproduce` matches.

DVC rewrites params.yaml on any `-S`, so each experiment's run is dirty and its diff travels with it;
a stored diff is applied by reproduce as it was recorded (a redactor that edited a comment in it,
`tokens: data.source text`, made every such reproduce fail). The only change to the shipped file is
`train.epochs` (30 -> 2, by text substitution, so every comment stays), and the commands name the
`train` stage as their target: evaluate and the speedup study make no training run (the gpt command
names `evaluate`, which it configures: its reproduce compares the test set's bits per byte too). The commands
that run in the workspace on the digits data run one after another in one copy (each reproduced
while the workspace holds its data); the gpt command has its own; the queued ones run together
(`dvc queue start -j 2`), as the README runs them.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from mlflow import MlflowClient

from helpers import REPO, copy_repo, output_tail, queue_logs, run_cli, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@e"]


def readme_experiments() -> list[list[str]]:
    """The arguments of every `dvc exp run` command in the README (code blocks, continuation lines
    joined, comments cut; then inline code), in the README's order; a command that differs from an
    earlier one only by its `-n NAME` is the same experiment and is left out."""
    readme = (REPO / "README.md").read_text()
    shell, fence = [], None
    for line in readme.splitlines():  # the lines of each shell code block
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence in ("", "bash", "sh"):
            shell.append(line)
    joined = "\n".join(shell).replace("\\\n", " ")
    lines = [line for line in joined.splitlines() if line.strip().startswith("dvc exp run")]
    found = [shlex.split(line, comments=True)[3:] for line in lines]
    found += [shlex.split(text)[3:] for text in re.findall(r"`(dvc exp run [^`]+)`", readme)]
    unique, seen = [], set()
    for args in found:
        named = args.index("-n") if "-n" in args else None
        key = tuple(args[:named] + args[named + 2 :]) if named is not None else tuple(args)
        if key not in seen:
            seen.add(key)
            unique.append(args)
    return unique


EXPERIMENTS = readme_experiments()


def small_corpus(folder: Path, num_files: int = 12) -> None:
    """The README's gpt corpus (Python's standard library), cut to the smallest files that fill
    three splits: the command is the README's, the data seconds of work."""
    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("[m-s]*.py"), key=lambda p: p.stat().st_size)
    folder.mkdir(parents=True)
    for path in [p for p in stdlib if p.stat().st_size > 4000][:num_files]:
        shutil.copy(path, folder / path.name)


QUEUED = [a for a in EXPERIMENTS if "--queue" in a]  # run together, as the README runs them
CORPUS = [a for a in EXPERIMENTS if "data.text.path=data/raw/stdlib" in a]  # gpt: a data set of its own
HERE = [a for a in EXPERIMENTS if a not in QUEUED + CORPUS]  # one after another in one workspace
GROUPS = [g for g in (HERE, CORPUS, QUEUED) if g]


def test_the_readme_commands_were_found():
    flat = [" ".join(a) for a in EXPERIMENTS]
    assert len(EXPERIMENTS) >= 6 and any("train.workload=gpt" in a for a in flat), flat
    assert len(QUEUED) >= 2 and any("speedup.precisions" in a for a in flat), flat


@pytest.mark.parametrize("commands", GROUPS, ids=[" ; ".join(" ".join(a) for a in g)[:60] for g in GROUPS])
def test_readme_experiments_reproduce(tmp_path, commands):
    with contextlib.ExitStack() as stack:
        run_group(tmp_path, commands, stack)


def run_group(tmp_path: Path, commands: list[list[str]], stack: contextlib.ExitStack) -> None:
    repo = copy_repo(tmp_path / "repo")
    shipped = (repo / "params.yaml").read_text()
    shortened = re.sub(r"(?m)^(  epochs: )30\b", r"\g<1>2", shipped)
    assert shortened != shipped and "tokens: data.source text" in shortened  # the comment that broke it
    (repo / "params.yaml").write_text(shortened)
    subprocess.run([*GIT, "commit", "-qam", "2 epochs"], cwd=repo, check=True)
    if any("data/raw/stdlib" in a for args in commands for a in args):
        small_corpus(repo / "data/raw/stdlib")
    if any("train.checkpoint_dir=store" in a for args in commands for a in args):  # as `make store` does
        from scalelab.storage import write_remote
        from services import s3_server

        server = stack.enter_context(s3_server(tmp_path / "store"))
        write_remote(repo, server.store("lab"), local=True)  # .dvc/config.local: ignored, no diff

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    if commands != QUEUED:  # each in the workspace, reproduced while the workspace holds its data
        for args in commands:  # to train (gpt: evaluate, which it configures); the study makes no training run
            subprocess.run(["git", "checkout", "--", "params.yaml", "dvc.lock"], cwd=repo, check=True)
            run_cli("dvc", "exp", "run", *args, "evaluate" if commands == CORPUS else "train", cwd=repo, timeout=900)
            reproduces(repo, client, json.loads((repo / "results/train/run.json").read_text())["run_id"], args)
        return
    for args in commands:  # queued: run together, as the README runs them
        run_cli("dvc", "exp", "run", *args, "train", cwd=repo, timeout=900)
    run_cli("dvc", "queue", "start", "-j", "2", cwd=repo)
    status = lambda: run_cli("dvc", "queue", "status", cwd=repo).stdout  # noqa: E731
    names = [args[args.index("-n") + 1] for args in commands]
    logs = queue_logs(repo, *names)
    wait_for(lambda: "Queued" not in status() and "Running" not in status(), 900, "the queue", log=logs, poll_s=3)
    assert status().count("Success") == len(commands), output_tail(logs)
    experiment = client.get_experiment_by_name("scalelab").experiment_id
    query = "tags.`scalelab.kind` = 'train' and tags.`dvc.exp_name` = '{}'"
    run_cli("dvc", "repro", "prepare", cwd=repo)  # their data, here: the queue ran in copies
    for name, args in zip(names, commands):
        reproduces(repo, client, client.search_runs([experiment], query.format(name))[0].info.run_id, args)


def reproduces(repo: Path, client: MlflowClient, run_id: str, args: list[str]) -> None:
    tags = client.get_run(run_id).data.tags
    assert tags["scalelab.reproducible"] == "true", (args, tags.get("scalelab.not_reproducible"))
    assert tags["provenance.redactions"] == "0", args  # nothing here is a secret
    proc = run_cli("reproduce", run_id, "--yes", cwd=repo, check=False, timeout=900)
    assert proc.returncode == 0 and "RESULT: match" in proc.stdout, (
        f"{args}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    )
    if "train.workload=gpt" in args:  # the text workload's figures are compared, not skipped
        rows = {line.split("  ")[0]: line for line in proc.stdout.splitlines()}
        for metric in ("val_bits_per_byte", "bits_per_byte", "perplexity", "train_loss"):
            row = next(v for k, v in rows.items() if k.startswith(f"metric {metric} "))
            assert row.endswith("match"), row
