"""Where the tracking store is, and making a new SQLite store its owner's alone.

The store is `MLFLOW_TRACKING_URI` when set, else the `tracking_uri` of the main repository's
git-ignored `.scalelab.local.yaml` (a clone pointed at the lab's server: `tracking_uri:
http://host:port`), else `mlflow.db` (SQLite) in the main repository (`runtime.paths.store_root`:
never a DVC experiment's temporary copy, never the current directory by accident). With an SQLite
store, a new experiment keeps its artifacts in `mlruns/` beside the database file, wherever the
command runs from.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from scalelab.runtime.paths import store_root
from scalelab.tracking.secrets import mask_uri

LOCAL_FILE = ".scalelab.local.yaml"  # a clone's own settings, ignored by git: the lab's tracking server


def tracking_uri() -> str:
    """The one place the tracking store is chosen: MLFLOW_TRACKING_URI, else `tracking_uri` in the
    main repository's git-ignored .scalelab.local.yaml (the lab's server), else an absolute sqlite
    URI for mlflow.db there."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = store_root()
    return local_tracking_uri(root / LOCAL_FILE) or f"sqlite:///{root / 'mlflow.db'}"


def uri_source(uri: str) -> str:
    """Where `uri` came from, as an error names it: MLFLOW_TRACKING_URI, the clone's
    .scalelab.local.yaml, else the tracking store (the default mlflow.db, or a caller's own)."""
    if os.environ.get("MLFLOW_TRACKING_URI") == uri:
        return "MLFLOW_TRACKING_URI"
    local = store_root() / LOCAL_FILE
    if local.is_file() and local_tracking_uri(local) == uri.rstrip("/"):
        return f"tracking_uri in {local}"
    return "the tracking store"


class LocalFileError(ValueError):
    """A malformed .scalelab.local.yaml: one line naming the file, the key, the value and what is
    allowed (not a ConfigError, which commands prefix with their params file)."""

    exit_status = 2  # the CLI's "bad input"


def local_tracking_uri(path: Path) -> str | None:
    """`tracking_uri` of a clone's .scalelab.local.yaml (None when the file is absent); raises
    LocalFileError (exit 2) naming the file, the key and the value for anything else than
    `tracking_uri: http(s)://host:port`."""
    if not path.is_file():
        return None
    allowed = "the only key is tracking_uri, an http:// or https:// URL such as http://login01:5000"
    try:
        settings = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LocalFileError(f"{path}: cannot be read as YAML ({first}); {allowed}") from None
    if settings is None:
        return None
    if not isinstance(settings, dict):
        raise LocalFileError(
            f"{path}: {type(settings).__name__} {mask_uri(str(settings))!r} is not a mapping; {allowed}"
        )
    unknown = sorted(str(k) for k in settings if k != "tracking_uri")
    if unknown:
        raise LocalFileError(f"{path}: unknown key {unknown[0]!r}; {allowed}")
    uri = settings.get("tracking_uri")
    if not isinstance(uri, str) or not uri.startswith(("http://", "https://")) or len(uri.split("://", 1)[1]) == 0:
        raise LocalFileError(f"{path}: tracking_uri = {mask_uri(str(uri))!r} is not allowed; {allowed}")
    return uri.rstrip("/")


def sqlite_file(uri: str) -> Path | None:
    """The database file of an `sqlite:///` URI, else None."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


@contextmanager
def store_init_lock(uri: str) -> Iterator[None]:
    """Held while this process first touches an SQLite store: two jobs started at once (queued DVC
    experiments) must not both create its tables. A no-op for a server.

    The store it creates is its owner's alone (`private_store`)."""
    db = sqlite_file(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(db.with_name(db.name + ".init-lock"), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    with os.fdopen(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        private_store(uri)
        yield


def private_store(uri: str) -> None:
    """Creates an SQLite store's file (0600) and artifact folder `mlruns/` (0700) if they are not
    there yet, whatever the umask, before MLflow creates them: a store that others can read shows
    them every run (SQLite gives its journal the database's mode). A no-op for a server."""
    db = sqlite_file(uri)
    if db is None or db.exists():
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))
    (db.parent / "mlruns").mkdir(mode=0o700, exist_ok=True)
