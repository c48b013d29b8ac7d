"""The `scalelab` command: one table of commands, one module each.

    scalelab validate  --params params.yaml --out results/validate.json
    scalelab prepare   --params params.yaml --out data/prepared
    scalelab train     --params params.yaml --data data/prepared --out results/train
    scalelab evaluate  --params params.yaml --data data/prepared --train results/train --out results/eval/metrics.json
    scalelab speedup   --params params.yaml --out results/speedup
    scalelab verify-data --data data/prepared
    scalelab summary | ui | sweep | reproduce | fetch | sample | send-metrics | bench

dvc.yaml owns the paths and passes them here. Every command module exposes
`add_arguments(parser)` and `run(args) -> int`. Exit status, for every command: 0 ok, 1 a failed
job or a mismatch, 2 bad input (one line that names the key or file, the value and the fix,
before any process, job or MLflow run starts).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# name -> (module with add_arguments/run, help); help None: a worker command, hidden from --help
COMMANDS: dict[str, tuple[str, str | None]] = {
    "validate": ("scalelab.cli.validate", "check every section of params.yaml (the pipeline's first stage)"),
    "prepare": ("scalelab.cli.prepare", "build data/prepared from params data.*"),
    "train": ("scalelab.cli.train", "train with params train.* (here, under torchrun, or on SLURM)"),
    "evaluate": ("scalelab.cli.evaluate", "score the trained model on the test split"),
    "verify-data": ("scalelab.cli.verify_data", "hash every prepared file and compare it with the manifest"),
    "speedup": ("scalelab.cli.speedup", "the speedup study: single vs DataParallel vs DDP at N workers"),
    "summary": ("scalelab.cli.summary", "print the pipeline's headline figures"),
    "ui": ("scalelab.cli.ui", "the MLflow UI on the project's store, opened on the experiment's runs table"),
    "sweep": (
        "scalelab.sweeps.sweep",
        "a grid of -S overrides as one SLURM job array, or an Optuna search (tpe, random); status; collect",
    ),
    "reproduce": ("scalelab.cli.reproduce", "rerun a tracked run from its provenance and compare"),
    "sample": ("scalelab.cli.sample", "text sampled from a trained language model (gpt)"),
    "send-metrics": ("scalelab.cli.send_metrics", "store the metrics a job wrote to unsent-metrics-<run>.json"),
    "fetch": ("scalelab.cli.fetch", "a run's prepared data and weights from the lab's store, checked by its hashes"),
    "store": ("scalelab.cli.store", "the lab's shared store: set, check, or serve one on this machine (rclone)"),
    "bench": ("scalelab.bench.suite", "benchmarks that write results/bench/*.json"),
    "train-worker": ("scalelab.cli.train_worker", None),
    "cell-worker": ("scalelab.cli.cell_worker", None),
    "bench-worker": ("scalelab.cli.bench_worker", None),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser; only the command named in `argv` imports its module (start-up stays light)."""
    parser = argparse.ArgumentParser(prog="scalelab", description=__doc__.split("\n")[0])
    visible = [name for name, (_, text) in COMMANDS.items() if text]
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(visible) + "}")
    chosen = next((arg for arg in argv if arg in COMMANDS), None)
    for name, (module, text) in COMMANDS.items():
        p = sub.add_parser(name, **({"help": text, "description": text} if text else {}))
        p.set_defaults(module=module)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command. `argv` None: a real command line (may re-exec into the workspace's code)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(words).parse_args(words)
    from scalelab.runtime.paths import REPO_ENV

    saved = os.environ.get(REPO_ENV)
    try:
        repo = workspace_of(args)
        if repo is not None:
            os.environ[REPO_ENV] = str(repo)  # every process this command starts agrees on it
            if argv is None:
                exec_workspace_code(repo)
        module = importlib.import_module(args.module)
        code = module.run(args)
        if argv is None and getattr(module, "EXIT_AT_ONCE", False):
            exit_at_once(code)
        return code
    except KeyboardInterrupt:  # Ctrl-C outside a job (a job says more: training.submit.Interrupted)
        return fail(args.command, Interrupted(), EXIT_INTERRUPTED)
    except Exception as exc:  # the project's errors carry their exit status (ConfigError: 2, ...)
        status = getattr(exc, "exit_status", None)
        if status is None:
            raise
        return fail(args.command, exc, status)
    finally:  # a command run in-process (tests) leaves the environment as it found it
        if saved is None:
            os.environ.pop(REPO_ENV, None)
        else:
            os.environ[REPO_ENV] = saved


def exit_at_once(code: int) -> None:
    """Ends a command whose work is done and on disk (a training job: outputs written atomically,
    the run closed, the metric writer drained) without the interpreter's teardown of torch, mlflow
    and their threads: about 1-4 s of a job's wall time, measured by `scalelab bench startup`."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class NotInRepository(ValueError):
    exit_status = EXIT_BAD_INPUT


class Interrupted(Exception):
    kind = "interrupted"

    def __str__(self) -> str:
        return "SIGINT (Ctrl-C)"


def workspace_of(args: argparse.Namespace) -> Path | None:
    """The repository that holds the command's params file (its nearest folder with dvc.yaml),
    whatever the current directory; None for a command without one, or a file that does not
    exist (the loader names it).

    Raises:
        NotInRepository: the params file lies outside any repository.
    """
    from scalelab.runtime.paths import find_repo

    params = getattr(args, "params", None)
    if not params or not Path(params).is_file():
        return None
    repo = find_repo(Path(params).resolve().parent)
    if repo is None:
        raise NotInRepository(
            f"{params}: not inside a scalelab repository (no dvc.yaml in its folder or any folder above); "
            "the repository holds the tracking store and the code that runs"
        )
    return repo


def exec_workspace_code(repo: Path) -> None:
    """Replaces this process with one that imports `repo`'s own libs/ and experiments/, when the
    `scalelab` on PATH imports another checkout (an editable install of the main workspace, while
    DVC runs a queued experiment in a copy of it). Returns when the code is already `repo`'s."""
    libs = repo / "libs"
    here = Path(__file__).resolve().parents[2]  # the libs/ folder this package was imported from
    if not (libs / "scalelab" / "__init__.py").is_file() or here == libs.resolve():
        return
    path = os.pathsep.join(p for p in (str(libs), str(repo), os.environ.get("PYTHONPATH", "")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "scalelab.cli", *sys.argv[1:]], {**os.environ, "PYTHONPATH": path})


def fail(command: str, exc: BaseException, status: int) -> int:
    """Prints the one-line error (or what interrupted it) of `scalelab COMMAND`; returns `status`."""
    print(f"scalelab {command}: {getattr(exc, 'kind', 'error')}: {exc}", file=sys.stderr)
    return status
