"""Real services for tests: PostgreSQL, MLflow servers and headless Chromium.

Each one runs on a free loopback port in a temporary folder and is stopped afterwards. A missing
Debian package is installed with apt-get when the tests run as root (as in CI); otherwise the test
skips and says what is missing. Import the fixtures from here into the test module that uses them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import BIN, REPO, free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_PACKAGES = ("chromium", "fonts-liberation", "fonts-dejavu-core")
# No network, no GPU, no sandbox (root in a container); nothing downloaded behind our back.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
POSTGRES_GLOB = "/usr/lib/postgresql/*/bin/initdb"
START_TIMEOUT_S = 240  # a first MLflow start creates its tables; slow on a busy 2-core machine


def is_root() -> bool:
    return os.geteuid() == 0


def apt_install(*packages: str) -> None:
    """apt-get install, refreshing the package lists once if the first try fails (root only)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    if subprocess.run(cmd, env=env, capture_output=True).returncode == 0:
        return
    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def tail(path: Path, num_chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-num_chars:] if path.is_file() else f"({path} is missing)"


def listening_addresses(port: int) -> set[str]:
    """The local addresses on which some process listens on TCP `port`."""
    import psutil

    return {
        c.laddr.ip for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


@dataclass(frozen=True)
class Service:
    """A started server: its URL, port, process and log file."""

    url: str
    port: int
    proc: subprocess.Popen
    log: Path


@contextmanager
def serve(
    cmd: list[str], port: int, log: Path, *, env: dict[str, str] | None = None, timeout_s: float = START_TIMEOUT_S
) -> Iterator[Service]:
    """Starts `cmd` in its own process group, waits for GET /health, and stops the group at exit."""
    log.parent.mkdir(parents=True, exist_ok=True)
    # what slurm/mlflow-server.sh and `scalelab ui` do: no MLflow job runner (8 processes per server)
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(os.environ if env is None else env)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, proc, log, timeout_s)
        yield Service(url, port, proc, log)
    finally:
        stop_group(proc)


def wait_for_health(url: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited {proc.returncode} before serving:\n{tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url}/health did not answer within {timeout_s:.0f} s:\n{tail(log)}")


def stop_group(proc: subprocess.Popen, timeout_s: float = 20) -> None:
    """SIGTERM to the process group (server and its workers), SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


SERVER_SCRIPT = REPO / "slurm/mlflow-server.sh"
# the script's settings, never inherited from the shell that runs the tests
SERVER_SETTINGS = ("HOST", "AUTH", "AUTH_DIR", "ALLOW_NO_AUTH", "ALLOWED_HOSTS", "CORS_ALLOWED_ORIGINS", "CHECK_ONLY")


def server_script_env(backend_uri: str, artifacts: Path, port: int, **env: str) -> dict[str, str]:
    """The environment slurm/mlflow-server.sh runs with: this one's, less its own settings."""
    full_env = {
        k: v
        for k, v in os.environ.items()
        if k not in SERVER_SETTINGS and not k.startswith(("MLFLOW_TRACKING_", "MLFLOW_AUTH_"))
    }
    full_env.update(
        PORT=str(port), BACKEND_STORE_URI=backend_uri, ARTIFACTS_DESTINATION=str(artifacts), WORKERS="1", **env
    )
    return full_env


def run_server_script(
    backend_uri: str, artifacts: Path, timeout_s: float = 60, **env: str
) -> subprocess.CompletedProcess:
    """slurm/mlflow-server.sh run to its end: a refusal, or CHECK_ONLY=1 (nothing served). A script
    that serves instead is stopped with its whole process group, and the test fails."""
    full_env = server_script_env(backend_uri, artifacts, free_port(), **env)
    cmd = [str(SERVER_SCRIPT)]
    proc = subprocess.Popen(
        cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        out, err = proc.communicate()
        raise AssertionError(
            f"slurm/mlflow-server.sh still ran after {timeout_s:.0f} s (it served):\n{err[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def mlflow_server_script(backend_uri: str, artifacts: Path, log: Path, **env: str):
    """slurm/mlflow-server.sh with its defaults (HOST left unset: it must bind 127.0.0.1)."""
    port = free_port()
    return serve([str(SERVER_SCRIPT)], port, log, env=server_script_env(backend_uri, artifacts, port, **env))


def mlflow_ui(store_uri: str, log: Path):
    """What `make ui` runs, on a free loopback port, with one worker (one browser; starts faster)."""
    port = free_port()
    cmd = [
        str(BIN / "mlflow"),
        "ui",
        "--backend-store-uri",
        store_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    return serve(cmd, port, log, env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})


@dataclass(frozen=True)
class Postgres:
    """A running PostgreSQL cluster with one database for MLflow (trust auth, loopback only)."""

    port: int
    user: str = "postgres"
    database: str = "mlflow"

    @property
    def uri(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"


def postgres_bin() -> Path | None:
    found = sorted(Path("/").glob(POSTGRES_GLOB.lstrip("/")), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    """A PostgreSQL server of its own in a temporary folder (Debian's `postgresql`).

    As root, initdb and pg_ctl run as the `postgres` user (PostgreSQL refuses root), in a folder
    that user owns outside pytest's private temp tree.
    """
    if postgres_bin() is None:
        if not is_root():
            pytest.skip(
                f"needs Debian's postgresql package (no {POSTGRES_GLOB}); install it, or run "
                "the tests as root so they install it"
            )
        apt_install("postgresql")
    bindir = postgres_bin()
    assert bindir is not None, f"apt-get installed postgresql but {POSTGRES_GLOB} is missing"
    if is_root():
        data = Path(tempfile.mkdtemp(prefix="scalelab-pg-"))
        shutil.chown(data, "postgres", "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    else:
        data, as_owner = tmp_path_factory.mktemp("postgres"), []
    port = free_port()

    def pg(tool: str, *args: str) -> None:
        proc = subprocess.run([*as_owner, str(bindir / tool), *args], capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, (
            f"{tool} {' '.join(args)} exited {proc.returncode}:\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}\n{tail(data / 'server.log')}"
        )

    pg("initdb", "-D", str(data / "db"), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
    # TCP on loopback only; the Unix socket goes into our own folder, not /var/run/postgresql.
    pg(
        "pg_ctl",
        "-D",
        str(data / "db"),
        "-l",
        str(data / "server.log"),
        "-w",
        "-t",
        "120",
        "-o",
        f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c fsync=off",
        "start",
    )
    try:
        pg("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "mlflow")
        yield Postgres(port)
    finally:
        subprocess.run(
            [*as_owner, str(bindir / "pg_ctl"), "-D", str(data / "db"), "-m", "fast", "-w", "stop"],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Headless Debian Chromium driven by Playwright (never `playwright install`: no download)."""
    if not CHROMIUM.exists():
        if not is_root():
            pytest.skip(
                f"needs Debian's chromium package ({CHROMIUM}); install it, or run the tests as root so they install it"
            )
        apt_install(*CHROMIUM_PACKAGES)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@contextmanager
def s3_server(base: Path, credentials: tuple[str, str] | None = None) -> Iterator[object]:
    """The real local S3 server of `make store` (rclone serve s3) over `base`, on a free port:
    yields scalelab.storage.server.Server (`.store()` is its bucket as a Store)."""
    from scalelab.storage import server as store_server

    found = store_server.start(base, free_port(), credentials=credentials)
    try:
        yield found
    finally:
        store_server.stop(base)


@pytest.fixture
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A local S3 server with an empty bucket, for one test."""
    with s3_server(tmp_path_factory.mktemp("s3")) as found:
        yield found
