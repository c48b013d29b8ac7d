"""The `scalelab` command: one table of commands, one module each.

    scalelab prepare   --params params.yaml --out data/prepared
    scalelab train     --params params.yaml --data data/prepared --out results/train
    scalelab evaluate  --params params.yaml --data data/prepared --train results/train --out results/eval/metrics.json
    scalelab speedup   --params params.yaml --out results/speedup
    scalelab verify-data --data data/prepared
    scalelab summary | sweep | reproduce | send-metrics | bench

dvc.yaml owns the paths and passes them here. Every command module exposes
`add_arguments(parser)` and `run(args) -> int`. Exit status, for every command: 0 ok, 1 a failed
job or a mismatch, 2 bad input (one line that names the key or file, the value and the fix,
before any process, job or MLflow run starts).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
# name -> (module with add_arguments/run, help); help None: a worker command, hidden from --help
COMMANDS: dict[str, tuple[str, str | None]] = {
    "prepare": ("scalelab.cli.prepare", "build data/prepared from params data.*"),
    "train": ("scalelab.cli.train", "train with params train.* (here, under torchrun, or on SLURM)"),
    "evaluate": ("scalelab.cli.evaluate", "score the trained model on the test split"),
    "verify-data": ("scalelab.cli.verify_data", "hash every prepared file and compare it with the manifest"),
    "speedup": ("scalelab.cli.speedup", "the speedup study: single vs DataParallel vs DDP at N workers"),
    "summary": ("scalelab.cli.summary", "print the pipeline's headline figures"),
    "sweep": ("scalelab.training.sweep", "a grid of -S overrides as one SLURM job array; status; collect"),
    "reproduce": ("scalelab.cli.reproduce", "rerun a tracked run from its provenance and compare"),
    "send-metrics": ("scalelab.cli.send_metrics", "store the metrics a job wrote to unsent-metrics-<run>.json"),
    "bench": ("scalelab.bench.suite", "benchmarks that write results/bench/*.json"),
    "train-worker": ("scalelab.cli.train_worker", None),
    "cell-worker": ("scalelab.cli.cell_worker", None),
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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return importlib.import_module(args.module).run(args)
    except Exception as exc:  # the project's errors carry their exit status (ConfigError: 2, ...)
        status = getattr(exc, "exit_status", None)
        if status is None:
            raise
        return fail(args.command, exc, status)


def fail(command: str, exc: Exception, status: int) -> int:
    """Prints the one-line error of `scalelab COMMAND` and returns `status`."""
    print(f"scalelab {command}: error: {exc}", file=sys.stderr)
    return status
