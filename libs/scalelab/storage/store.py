"""Which store this clone uses, how to reach it, and whether it answers.

`configured()` reads DVC's default remote (every config level: `.dvc/config`, the git-ignored
`.dvc/config.local`, the user's and the system's), so DVC and scalelab can never disagree on
where the store is. Credentials come from that remote's `access_key_id`/`secret_access_key`
(`.dvc/config.local`, 0600) or, when it has none, from the environment and `~/.aws`, as botocore
finds them. They never appear in a `Store`'s repr, a log line or an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHECKPOINTS = "checkpoints"  # <store>/checkpoints/...: train.checkpoint_dir: store
MLFLOW_ARTIFACTS = "mlflow-artifacts"  # <store>/mlflow-artifacts: the tracking server's artifact root
REMOTE = "store"  # the DVC remote `scalelab store set` writes
CHECK_TIMEOUT_S = 10


class StoreError(RuntimeError):
    """The store cannot be used: one line naming the store, what failed and what to do."""

    exit_status = 2  # bad input: said before any process, job or run starts


def is_url(location: str | os.PathLike) -> bool:
    """True for a remote location (`s3://...`, any fsspec protocol but file://), False for a path."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


@dataclass(frozen=True)
class Store:
    """The lab's store: a URL (`s3://bucket/prefix`) or a shared folder, and how to reach it."""

    url: str
    endpoint: str = ""  # an S3-compatible server; "" for AWS itself
    access_key_id: str = field(default="", repr=False)
    secret_access_key: str = field(default="", repr=False)
    remote: str = REMOTE

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", str(self.url).rstrip("/") or "/")

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")

    def join(self, *parts: str) -> str:
        """A location inside the store."""
        tail = "/".join(p.strip("/") for p in parts if p)
        return f"{self.url}/{tail}" if tail else self.url

    def contains(self, location: str) -> bool:
        return location == self.url or str(location).startswith(self.url + "/")

    def describe(self) -> str:
        """The store as a log line names it (never its credentials)."""
        return f"{self.url} (endpoint {self.endpoint})" if self.endpoint else self.url

    def options(self) -> dict[str, Any]:
        """fsspec storage options (s3fs) for locations inside the store."""
        if not self.is_s3:
            return {}
        options: dict[str, Any] = {}
        if self.endpoint:
            options["endpoint_url"] = self.endpoint
        if self.access_key_id:
            options["key"] = self.access_key_id
            options["secret"] = self.secret_access_key
        return options

    def env(self) -> dict[str, str]:
        """Environment for a process that reaches the store with botocore (an MLflow server)."""
        env = {}
        if self.endpoint:
            env["MLFLOW_S3_ENDPOINT_URL"] = self.endpoint
            env["AWS_ENDPOINT_URL_S3"] = self.endpoint
        if self.access_key_id:
            env["AWS_ACCESS_KEY_ID"] = self.access_key_id
            env["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        return env

    def check(self, timeout_s: float = CHECK_TIMEOUT_S) -> None:
        """Raises StoreError unless the store answers and these credentials may list it."""
        if not self.is_s3:
            if is_url(self.url):
                return  # another fsspec protocol: its own client says what is wrong on first use
            folder = Path(self.url)
            if not folder.is_dir():
                raise StoreError(
                    f"store {self.url}: no such folder (create it, or point at another with `scalelab store set`)"
                )
            if not os.access(folder, os.W_OK | os.X_OK):
                raise StoreError(f"store {self.url}: this user may not write the folder")
            return
        fs = s3_filesystem(self, timeout_s)
        bucket = self.url.removeprefix("s3://").split("/")[0]
        try:
            fs.ls(bucket, refresh=True)
        except PermissionError as exc:
            raise StoreError(
                f"store {self.describe()}: the credentials were refused ({first_line(exc)}); {HOW}"
            ) from None
        except FileNotFoundError:
            raise StoreError(f"store {self.describe()}: bucket {bucket!r} does not exist") from None
        except Exception as exc:  # botocore's connection and credential errors
            name = type(exc).__name__
            if "Credential" in name:
                raise StoreError(f"store {self.describe()}: no credentials found; {HOW}") from None
            raise StoreError(f"store {self.describe()} cannot be reached: {first_line(exc)}") from None


HOW = (
    "set them with `AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... scalelab store set URL`"
    " (kept in .dvc/config.local) or in the environment"
)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def s3_filesystem(store: Store, timeout_s: float = 60, attempts: int = 3):
    import s3fs

    config = {"connect_timeout": timeout_s, "read_timeout": timeout_s, "retries": {"max_attempts": attempts}}
    return s3fs.S3FileSystem(**store.options(), config_kwargs=config, skip_instance_cache=True)


def configured(root: str | os.PathLike | None = None) -> Store | None:
    """The store of the DVC repository at `root` (default: the working directory): its default
    remote, or None when it has none."""
    from dvc.config import Config

    dvc_dir = Path(root or os.getcwd()) / ".dvc"
    if not dvc_dir.is_dir():
        return None
    config = Config(dvc_dir=str(dvc_dir))
    name = config.get("core", {}).get("remote")
    if not name:
        return None
    remote = config.get("remote", {}).get(name)
    if remote is None:
        raise StoreError(f".dvc/config: core.remote names {name!r}, which is not a remote (dvc remote list)")
    return Store(
        url=str(remote["url"]),
        endpoint=str(remote.get("endpointurl", "") or ""),
        access_key_id=str(remote.get("access_key_id", "") or ""),
        secret_access_key=str(remote.get("secret_access_key", "") or ""),
        remote=name,
    )


def filesystem(location: str | os.PathLike, store: Store | None = None):
    """(fsspec filesystem, path in it) for a local path or a URL; a URL inside `store` is reached
    with the store's endpoint and credentials."""
    import fsspec

    text = str(location)
    if not is_url(text):
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem(), os.path.abspath(text.removeprefix("file://"))
    if store is not None and store.contains(text) and store.is_s3:
        return s3_filesystem(store), text.removeprefix("s3://")
    return fsspec.core.url_to_fs(text)


def write_remote(repo: str | os.PathLike, store: Store, local: bool = False) -> None:
    """Makes `store` the default DVC remote of `repo`: in `.dvc/config` (committed: the lab shares
    it) or, with `local`, in `.dvc/config.local`; its credentials always go to `.dvc/config.local`,
    readable by its owner only."""
    from dvc.config import Config

    config = Config(dvc_dir=str(Path(repo) / ".dvc"))
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
    local_file = Path(repo) / ".dvc" / "config.local"
    if local_file.exists():
        os.chmod(local_file, 0o600)
