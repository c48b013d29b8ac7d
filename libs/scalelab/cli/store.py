"""`scalelab store`: the lab's shared store (DVC remote, MLflow artifacts, checkpoints).

    scalelab store set s3://bucket/prefix --endpoint https://s3.lab.example   # a lab's S3 (MinIO, Ceph, AWS)
    scalelab store set /nfs/lab/scalelab                                        # or a shared folder
    scalelab store check                                                        # answers, and may we list it?
    scalelab store serve                                                        # a local S3 server (make store)
    scalelab store stop                                                         # (make store-stop)

`set` makes the URL DVC's default remote (`.dvc/config`, committed: colleagues share it; with
--local, `.dvc/config.local` only) and keeps the credentials it finds in AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY in `.dvc/config.local` (0600, ignored by git). Credentials are never taken
from the command line (shell history, `ps`). `serve` starts `rclone serve s3` on 127.0.0.1 with
generated credentials and points this clone at it (--local).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from scalelab.storage import server

    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("set", help="make URL (s3://bucket/prefix or a shared folder) this clone's store")
    p.add_argument("url", help="s3://bucket/prefix, or a folder on a shared filesystem")
    p.add_argument("--endpoint", default="", help="an S3-compatible server's URL (default: AWS)")
    p.add_argument("--local", action="store_true", help="write .dvc/config.local only (this clone, not git)")
    p.add_argument("--repo", default=".", help="the repository (default: .)")
    p = sub.add_parser("check", help="exit 0 when the store answers and the credentials may list it; else 2")
    p.add_argument("--repo", default=".", help="the repository (default: .)")
    for name, text in (
        ("serve", "start a local S3 server (rclone) and make it this clone's store"),
        ("stop", "stop the local S3 server (its objects stay)"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--base", default=str(server.DEFAULT_BASE), help=f"its folder (default: {server.DEFAULT_BASE})")
        p.add_argument(
            "--port",
            type=int,
            default=server.DEFAULT_PORT,
            help=f"its port on 127.0.0.1 (default: {server.DEFAULT_PORT})",
        )
        p.add_argument("--repo", default=".", help="the repository to point at it (default: .)")


def run(args: argparse.Namespace) -> int:
    from scalelab.storage import Store, configured, server

    repo = Path(args.repo)
    if args.action == "set":
        store = Store(
            args.url if "://" in args.url else str(Path(args.url).absolute()),
            args.endpoint,
            os.environ.get("AWS_ACCESS_KEY_ID", ""),
            os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        )
        store.check()  # before anything is written: refused credentials change nothing
        configure(repo, store, local=args.local)
        print(f"store: {store.describe()} (DVC remote {store.remote!r}, default)")
        return 0
    if args.action == "check":
        store = configured(repo)
        if store is None:
            print("no store: this clone has no default DVC remote (scalelab store set URL)")
            return 2
        store.check()
        print(f"store {store.describe()}: answers, and these credentials may list it")
        return 0
    if args.action == "stop":
        print("stopped" if server.stop(args.base) else f"no store server ran over {args.base}")
        return 0
    found = server.running(args.base)
    if found is None:
        found = server.start(args.base, args.port)
    configure(repo, found.store(), local=True)
    found.store().check()
    print(f"store: {found.store().describe()} over {found.base}/data (log {found.log}); stop it with make store-stop")
    return 0


def configure(repo: Path, store, local: bool) -> None:
    """Writes `store` as DVC's default remote; its credentials go to .dvc/config.local, 0600."""
    from dvc.config import Config

    config = Config(dvc_dir=str(repo / ".dvc"))
    with config.edit("local") as conf:  # an earlier store's settings here would override or clash with the new one
        old = conf.get("remote", {}).get(store.remote, {})
        for key in ("url", "endpointurl", "access_key_id", "secret_access_key"):
            old.pop(key, None)
        if not old:
            conf.get("remote", {}).pop(store.remote, None)
    with config.edit("local" if local else "repo") as conf:
        conf.setdefault("core", {})["remote"] = store.remote
        remote = {"url": store.url, **({"endpointurl": store.endpoint} if store.endpoint else {})}
        conf.setdefault("remote", {})[store.remote] = remote
    if store.access_key_id:
        with config.edit("local") as conf:
            keys = {"access_key_id": store.access_key_id, "secret_access_key": store.secret_access_key}
            conf.setdefault("remote", {}).setdefault(store.remote, {}).update(keys)
    local_file = repo / ".dvc" / "config.local"
    if local_file.exists():
        os.chmod(local_file, 0o600)
