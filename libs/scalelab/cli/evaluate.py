"""`scalelab evaluate`: the trained model on the test split."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--params", default="params.yaml", help="the params file; its evaluate.* section (default: params.yaml)"
    )
    parser.add_argument("--data", required=True, help="the prepared-data folder whose test split is scored")
    parser.add_argument(
        "--train", required=True, help="the training folder (scalelab train's --out) whose model is scored"
    )
    parser.add_argument(
        "--out", required=True, help="the JSON file of test metrics to write (results/eval/metrics.json)"
    )


def run(args: argparse.Namespace) -> int:
    from scalelab.config import load_params
    from scalelab.training import evaluation

    m = evaluation.run(load_params(args.params), args.data, args.train, args.out)
    if "bits_per_byte" in m:
        scores = f"test loss {m['test_loss']:.4f}, perplexity {m['perplexity']:.3f}, {m['bits_per_byte']:.4f} bits/byte"
    else:
        scores = f"test accuracy {m['test_accuracy']:.4f}, test loss {m['test_loss']:.4f}"
    print(f"{scores} on {m['num_test_samples']} samples -> {args.out}")
    return 0
