"""`scalelab send-metrics FILE...`: store metrics a job could not send (see scalelab.tracking.unsent)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=Path, help="unsent-metrics-<run id>.json files a failed job named")


def run(args: argparse.Namespace) -> int:
    from scalelab.cli import EXIT_OK
    from scalelab.tracking import tracking_uri, unsent

    for path in args.files:
        print(unsent.send(path, tracking_uri()), flush=True)
    return EXIT_OK
