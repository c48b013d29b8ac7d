"""The `scalelab` command: one thin subcommand per pipeline stage.

    scalelab prepare  --params params.yaml --out data/prepared
    scalelab train    --params params.yaml --data data/prepared --out results/train
    scalelab evaluate --params params.yaml --data data/prepared --train results/train --out results/eval/metrics.json
    scalelab speedup  --params params.yaml --out results/speedup
    scalelab summary

dvc.yaml owns the paths and passes them here. Bad input exits with status 2 and one line that
names the key or file, the value and the fix, before any process or MLflow run starts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from scalelab.config import ConfigError

EXIT_BAD_INPUT = 2
# subcommands with their own argument parsers: name -> (module with main(argv) -> int, help)
DELEGATED = {
    "sweep": ("scalelab.sweep", "submit a grid of overrides as one SLURM job array; status; collect"),
    "reproduce": ("scalelab.reproduce", "rerun a tracked run from its provenance and compare"),
    "bench": ("scalelab.benchmarks", "benchmarks that write results/bench/*.json"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scalelab", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="build data/prepared from params data.*")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", required=True)
    for name in ("train", "train-worker"):
        p = sub.add_parser(name, help="train (train-worker: one rank, started by a launcher)")
        p.add_argument("--params", default="params.yaml")
        p.add_argument("--data", required=True)
        p.add_argument("--out", required=True)
    p = sub.add_parser("evaluate", help="score the trained model on the test split")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--data", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("speedup", help="the speedup study: single vs DataParallel vs DDP at N workers")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--out", required=True)
    p = sub.add_parser("bench-worker", help="one study cell (started by `scalelab speedup`)")
    p.add_argument("kind", choices=["steps", "allreduce"])
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    for name, (module, text) in DELEGATED.items():
        p = sub.add_parser(name, help=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("summary", help="print the pipeline's headline figures")
    p.add_argument("--results", default="results")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args, extra = _parser().parse_known_args(argv)
    if extra and args.command not in DELEGATED:
        _parser().error(f"unrecognized arguments: {' '.join(extra)}")
    from scalelab.data import DataError
    from scalelab.launch import LaunchError

    try:
        if args.command in DELEGATED:
            import importlib

            return importlib.import_module(DELEGATED[args.command][0]).main(extra + args.rest) or 0
        return COMMANDS[args.command](args) or 0
    except (ConfigError, DataError) as exc:
        print(f"scalelab {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LaunchError as exc:
        print(f"scalelab {args.command}: error: {exc}", file=sys.stderr)
        return 1


def cmd_prepare(args: argparse.Namespace) -> None:
    from scalelab import data
    from scalelab.params import load_params

    manifest = data.prepare(load_params(args.params).data, args.out)
    counts = {k: v["num_samples"] for k, v in manifest["splits"].items()}
    print(f"prepared {manifest['source']} data in {args.out}: {counts} samples, "
          f"{manifest['num_classes']} classes, input shape {manifest['input_shape']}")


def cmd_train(args: argparse.Namespace) -> int:
    """Validates everything, then trains here (single, dp) or under torchrun (ddp)."""
    from scalelab import data, launch, workloads
    from scalelab.params import check_runtime, load_params

    params = load_params(args.params)
    try:
        check_runtime(params.train)
    except ConfigError as exc:
        raise ConfigError(f"{args.params}: {exc}") from None
    manifest = data.verify(args.data)
    workloads.load(params.train.workload, params.train.model,  # a model that cannot be built fails here
                   input_shape=manifest["input_shape"], num_classes=manifest["num_classes"])
    if params.train.launcher == "slurm":
        launch.run_slurm(params, args.data, args.out)
        return 0
    if params.train.strategy == "ddp":
        launch.run_local(params, args.params, args.data, args.out)
        return 0
    return cmd_train_worker(args)


def cmd_train_worker(args: argparse.Namespace) -> int:
    from scalelab import train
    from scalelab.params import load_params
    from scalelab.signals import raise_on_sigterm

    raise_on_sigterm()
    summary = train.run(load_params(args.params), args.data, args.out)
    if summary.get("samples_per_s") and summary.get("run_id"):  # rank 0 holds the run
        logging.getLogger("scalelab").info("trained %d steps: %.0f samples/s, %.2f ms/step",
                                           summary["step"], summary["samples_per_s"], summary["step_time_ms"])
    return 0


def cmd_evaluate(args: argparse.Namespace) -> None:
    from scalelab import evaluate
    from scalelab.params import load_params

    m = evaluate.run(load_params(args.params), args.data, args.train, args.out)
    print(f"test accuracy {m['test_accuracy']:.4f}, test loss {m['test_loss']:.4f} "
          f"on {m['num_test_samples']} samples -> {args.out}")


def cmd_speedup(args: argparse.Namespace) -> None:
    from scalelab import study
    from scalelab.params import load_params

    head = study.run(load_params(args.params), args.out)
    print(f"speedup study: {head['headline']} -> {args.out}/speedup.md")


def cmd_bench_worker(args: argparse.Namespace) -> None:
    from scalelab import bench

    bench.main(args.kind, args.spec, args.out)


def cmd_summary(args: argparse.Namespace) -> None:
    from scalelab.report import summary

    print(summary(Path(args.results)))


COMMANDS = {"prepare": cmd_prepare, "train": cmd_train, "train-worker": cmd_train_worker,
            "evaluate": cmd_evaluate, "speedup": cmd_speedup, "bench-worker": cmd_bench_worker,
            "summary": cmd_summary}

if __name__ == "__main__":
    sys.exit(main())
