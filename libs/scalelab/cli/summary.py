"""`scalelab summary`: the pipeline's headline figures, and where to look."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results", default="results", help="the results folder whose figures are read (default: results)"
    )


def run(args: argparse.Namespace) -> int:
    print(summary(Path(args.results)))
    return 0


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def summary(results: Path) -> str:
    """A few lines: accuracy, throughput, speedup, and where to look."""
    ev, tr = _read(results / "eval" / "metrics.json"), _read(results / "train" / "metrics.json")
    sp = _read(results / "speedup" / "speedup.json")
    lines = ["scalelab pipeline summary"]
    if "test_accuracy" in ev:
        lines.append(f"  test accuracy   {ev['test_accuracy']:.4f}  (results/eval/metrics.json)")
    if "bits_per_byte" in ev:  # a language model
        figures = f"{ev['bits_per_byte']:.4f}, perplexity {ev['perplexity']:.3f}"
        lines.append(f"  test bits/byte  {figures}  (results/eval/metrics.json)")
    if tr.get("samples_per_s"):
        lines.append(
            f"  train throughput {tr['samples_per_s']:,.0f} samples/s, "
            f"{tr['step_time_ms']:.2f} ms/step  (results/train/metrics.json)"
        )
    if sp:  # the headline carries the bootstrap intervals, and says "noisy" when the cells are
        lines.append(f"  speedup study   {sp.get('headline', '')}  (results/speedup/speedup.md)")
    run = _read(results / "train" / "run.json").get("run_id")
    if run:
        lines.append(f"  training run    {run}  (results/train/run.json)")
    from scalelab.tracking import tracking_uri
    from scalelab.tracking.secrets import mask_uri

    store = mask_uri(tracking_uri())  # MLFLOW_TRACKING_URI > .scalelab.local.yaml > mlflow.db
    lines.append(f"  runs            make ui  (prints the address of the runs table; store: {store})")
    return "\n".join(lines)
