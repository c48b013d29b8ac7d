"""`scalelab prepare`: data/prepared/ from params `data.*`."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--params", default="params.yaml", help="the params file; its data.* section (default: params.yaml)"
    )
    parser.add_argument(
        "--out", required=True, help="the folder to write the prepared data and its manifest to (data/prepared)"
    )


def run(args: argparse.Namespace) -> int:
    from scalelab.config import load_params
    from scalelab.config.registry import check_config
    from scalelab.data.prepare import prepare

    params = load_params(args.params)
    seq_len = None
    if params.data.kind == "tokens":  # a training sample is seq_len + 1 tokens of the corpus
        seq_len = check_config(params.train.workload, params.train.model, "train").seq_len
    manifest = prepare(params.data, args.out, min_train_samples=params.train.global_batch, seq_len=seq_len)
    splits = manifest["splits"]
    if manifest["kind"] == "tokens":
        counts = {k: f"{v['num_tokens']:,} tokens / {v['num_documents']:,} documents" for k, v in splits.items()}
        skipped = manifest["skipped"]
        print(
            f"prepared {manifest['source']} data in {args.out}: {counts}; {manifest['tokenizer']} tokenizer, "
            f"vocabulary {manifest['vocab_size']}; skipped {skipped['not_utf8']} non-UTF-8 and {skipped['empty']} "
            "empty file(s)"
        )
        return 0
    counts = {k: v["num_samples"] for k, v in splits.items()}
    print(
        f"prepared {manifest['source']} data in {args.out}: {counts} samples, "
        f"{manifest['num_classes']} classes, input shape {manifest['input_shape']}"
    )
    return 0
