"""`scalelab prepare`: data/prepared/ from params `data.*`."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", required=True)


def run(args: argparse.Namespace) -> int:
    from scalelab.config import load_params
    from scalelab.data.prepare import prepare

    params = load_params(args.params)
    manifest = prepare(params.data, args.out, min_train_samples=params.train.global_batch)
    counts = {k: v["num_samples"] for k, v in manifest["splits"].items()}
    print(
        f"prepared {manifest['source']} data in {args.out}: {counts} samples, "
        f"{manifest['num_classes']} classes, input shape {manifest['input_shape']}"
    )
    return 0
