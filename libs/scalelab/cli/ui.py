"""`scalelab ui`: the MLflow UI on the project's store, opened on the experiment's runs table.

    scalelab ui --params params.yaml --host 127.0.0.1 --port 5000     # what `make ui` runs

It prints the address of the runs table in MLflow's model-training view (the UI otherwise opens on
its GenAI home, where training runs do not show), then replaces itself with `mlflow ui` on the
store that every stage writes to (the main repository's mlflow.db, or MLFLOW_TRACKING_URI). When
that store is the lab's tracking server (MLFLOW_TRACKING_URI or .scalelab.local.yaml), the server
serves its own UI: it prints that address and starts nothing. The store's URI goes to MLflow
through the environment (MLFLOW_BACKEND_STORE_URI), never on the command line, where `ps` shows a
database password to every user. The UI has no login: like `make mlflow-server`
(slurm/mlflow-server.sh), it binds only a loopback address unless ALLOW_NO_AUTH=1 is set; a team
shares runs through that server, which requires a password.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml", help="its tracking.experiment is the one shown")
    parser.add_argument("--host", default="127.0.0.1", help="the address the UI listens on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5000, help="the TCP port the UI listens on (default: 5000)")
    parser.add_argument("--print-only", action="store_true", help="print the address and exit; start nothing")


def run(args: argparse.Namespace) -> int:
    from scalelab.config import load_params
    from scalelab.tracking import tracking_uri
    from scalelab.tracking.secrets import mask_uri
    from scalelab.tracking.tracker import runs_table

    if not is_loopback(args.host) and os.environ.get("ALLOW_NO_AUTH") != "1":
        raise ExposedWithoutAuth(
            f"--host {args.host}: the MLflow UI has no login, so it binds only a loopback address "
            "(127.0.0.1, ::1, localhost); share runs through `make mlflow-server` with AUTH=basic, "
            "or set ALLOW_NO_AUTH=1"
        )
    experiment = load_params(args.params).tracking.experiment
    uri = tracking_uri()
    if uri.startswith(("http://", "https://")):  # the lab's server: its own UI
        print(f"MLflow UI (the lab's server), experiment {experiment!r}: {runs_table(mask_uri(uri), experiment)}")
        return 0
    print(f"MLflow UI, experiment {experiment!r}: {runs_table(f'http://{args.host}:{args.port}', experiment)}")
    if args.print_only:
        return 0
    sys.stdout.flush()
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    cmd = [mlflow, "ui", "--host", args.host, "--port", str(args.port), "--workers", "1"]
    os.environ["MLFLOW_BACKEND_STORE_URI"] = uri  # not in argv: `ps` shows argv to every user
    # MLflow's job runner (8 more processes) serves GenAI jobs that scalelab never submits
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    os.execv(mlflow, cmd)
    return 0  # not reached


class ExposedWithoutAuth(ValueError):
    exit_status = 2


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
