"""`scalelab train`: validates and plans, then trains here (single, dp), under torchrun (ddp) or
on SLURM (`train.launcher: slurm`)."""

from __future__ import annotations

import argparse

EXIT_AT_ONCE = True  # on success the job's outputs are on disk and its run closed: skip the teardown (cli)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--params", default="params.yaml", help="the params file; its train.* section (default: params.yaml)"
    )
    parser.add_argument(
        "--data", required=True, help="the prepared-data folder (scalelab prepare's --out: data/prepared)"
    )
    parser.add_argument(
        "--out", required=True, help="the folder for model.pt, best.pt, metrics.json, run.json and checkpoints/"
    )


def run(args: argparse.Namespace) -> int:
    from scalelab.runtime.timings import mark

    mark("launcher_cli")  # python and scalelab.cli are up
    from scalelab.config import ConfigError, load_params
    from scalelab.training.submit import launch

    mark("launcher_imported")
    params = load_params(args.params)
    try:
        launch(params, args.data, args.out)
    except ConfigError as exc:
        raise ConfigError(f"{args.params}: {exc}") from None
    mark("launcher_done")
    return 0
