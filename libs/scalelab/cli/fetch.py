"""`scalelab fetch RUN_ID`: a run's prepared data and weights, from the lab's store, checked.

    scalelab fetch 3f2a...                       # -> results/fetch/3f2a.../{data/prepared/*,model.pt,best.pt}
    scalelab reproduce 3f2a... --data results/fetch/3f2a.../data/prepared

The run is looked up in the tracking store (MLFLOW_TRACKING_URI: the lab's server), the files in
this clone's store (`scalelab store set`), by the md5 and sha256 the run recorded
(scalelab.reproduce.fetch). Exit 2, one line: an unknown run, or a store without its objects;
exit 1: a file whose hash is not the recorded one (not kept).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", help="the MLflow run id of a training run (scalelab summary, the UI)")
    parser.add_argument("--out", help="where to write the files (default: results/fetch/RUN_ID under --repo)")
    parser.add_argument("--repo", default=".", help="the clone whose store to read (default: .)")


def run(args: argparse.Namespace) -> int:
    from scalelab.reproduce.fetch import fetch

    repo = Path(args.repo)
    out = Path(args.out) if args.out else repo / "results" / "fetch" / args.run_id
    written = fetch(args.run_id, repo, out)
    print(f"run {args.run_id}: {len(written)} files from the store, md5 and sha256 as recorded, in {out}")
    return 0
