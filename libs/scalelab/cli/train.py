"""`scalelab train`: validates and plans, then trains here (single, dp), under torchrun (ddp) or
on SLURM (`train.launcher: slurm`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)


def run(args: argparse.Namespace) -> int:
    from scalelab.config import ConfigError, load_params
    from scalelab.training.submit import launch

    params = load_params(args.params)
    try:
        launch(params, args.data, args.out)
    except ConfigError as exc:
        raise ConfigError(f"{args.params}: {exc}") from None
    return 0
