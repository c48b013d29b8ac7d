"""Shared fixtures and the suite's rules: a temporary copy of the repo, prepared digits, the local
SLURM cluster; the tiers, the time limit of the fast tier, and a checkout that no test writes into.

Everything runs on CPU with tiny data. Tests that need a service (SLURM, PostgreSQL, Chromium)
carry a marker and skip with a stated reason only where the service cannot be had. Helpers that
tests call live in helpers.py.

Tiers: `make test-fast` runs every test without a marker in SLOW_MARKERS; `make test` runs all.
A test with no marker at all that takes more than UNIT_LIMIT_S (its call, not its fixtures) fails,
and so does a fast-tier `integration` or `distributed` test past FAST_LIMIT_S: give it `slow`
(or make it cheaper). Both limits are wall time on an idle machine and stretch with the load
average per core, so other jobs on the machine do not fail a test that is fast alone.

Under pytest-xdist the tests of one service share one worker (`xdist_group`, with `--dist
loadgroup`); each worker has its own temporary folder and session fixtures, except the trained
pipeline, which the first worker builds for all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers import ARTIFACTS_ENV, RELIABILITY_ENV, REPO, copy_repo, reliability_path, shown_artifacts_dir
from services import browser  # noqa: F401 (one session fixture: Playwright's sync API allows one per thread)

pytest_plugins = ["cpu_report"]  # SCALELAB_TEST_CPU=<file>: each test's CPU seconds (tests/cpu_report.py)

# Hypothesis keeps caches (constants, unicode data) in ./.hypothesis: not in the checkout
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(Path(tempfile.gettempdir()) / "scalelab-hypothesis"))
# markers that keep a test out of `make test-fast` (services, or a cost of more than a few seconds)
SLOW_MARKERS = ("slow", "slurm", "browser", "postgres", "gpu")
TIER_MARKERS = {"integration", "distributed", *SLOW_MARKERS}
# tests of one service run on one xdist worker: one SLURM cluster, one PostgreSQL server
GROUPS = {"slurm": "slurm", "postgres": "postgres", "browser": "browser"}
# tests/bench/ runs whole benchmarks (processes, timed repeats): `make test` only, but for these
BENCH_TESTS, BENCH_FAST = REPO / "tests/bench", {"test_stats.py"}
UNIT_LIMIT_S = float(os.environ.get("SCALELAB_TEST_UNIT_LIMIT_S", "5"))
FAST_LIMIT_S = float(os.environ.get("SCALELAB_TEST_FAST_LIMIT_S", "30"))
# what tools may write in the checkout (pytest's and Python's caches; .venv is `make setup`'s)
CHECKOUT_IGNORED = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}
_CHECKOUT = pytest.StashKey[dict]()  # the checkout's files when the session started
_CHANGED = pytest.StashKey[tuple]()  # (written by tests, tracked files edited) when it ended


def pytest_sessionstart(session: pytest.Session) -> None:
    """Notes the checkout's files; a bare pytest run writes the fault tests' figures into its own
    temporary folder. (This runs before pytest-xdist starts its workers, which inherit both.)"""
    config = session.config
    if hasattr(config, "workerinput"):
        return
    base = config._tmp_path_factory.getbasetemp()
    if not os.environ.get(RELIABILITY_ENV):  # `make test` sets it to results/bench/reliability.json
        os.environ[RELIABILITY_ENV] = str(base / "reliability.json")
    if not os.environ.get(ARTIFACTS_ENV):  # `make test` sets it to results/test-artifacts
        os.environ[ARTIFACTS_ENV] = str(base / "test-artifacts")
    config.stash[_CHECKOUT] = checkout_files()


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups the tests of one service on one xdist worker; marks the benchmarks' tests `slow`; puts
    the costly tests first."""
    for item in items:
        path = Path(str(item.path))
        if path.parent == BENCH_TESTS and path.name not in BENCH_FAST:
            item.add_marker(pytest.mark.slow)
        for marker, group in GROUPS.items():
            if item.get_closest_marker(marker) and not item.get_closest_marker("xdist_group"):
                item.add_marker(pytest.mark.xdist_group(group))
    # xdist hands tests out in this order (after the groups, which --dist loadgroup sends first):
    # longest first, so that the run ends on short tests spread over every worker rather than on
    # one worker finishing a long test alone. (make test-fast shuffles the order after this.)
    items.sort(key=cost_rank)


def cost_rank(item: pytest.Item) -> int:
    """0 for `slow` tests, 1 for tests that start processes, 2 for the rest."""
    if item.get_closest_marker("slow"):
        return 0
    return 1 if item.get_closest_marker("integration") or item.get_closest_marker("distributed") else 2


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Fails a fast-tier test that took longer than its tier allows, in a run of the fast tier (`-m`
    leaves out `slow`, as `make test-fast` does). `make test` starts 4 workers at once on 2 cores,
    where the load average lags the load: a limit there fails tests for the machine's timing."""
    report = yield
    if call.when != "call" or not report.passed or "not slow" not in (item.config.option.markexpr or ""):
        return report
    markers = {m.name for m in item.iter_markers()} & TIER_MARKERS
    if markers & set(SLOW_MARKERS):
        return report
    limit_s, kind = (FAST_LIMIT_S, "fast-tier integration") if markers else (UNIT_LIMIT_S, "unmarked")
    load = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))  # wall time stretches with the load
    if call.duration > limit_s * load:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: an {kind} test took {call.duration:.1f} s, more than {limit_s:.0f} s x {load:.1f} "
            "(the load per core): mark it `slow` (it then runs in `make test` only) or make it cheaper"
        )
    return report


def checkout_files(root: Path = REPO) -> dict[str, tuple[int, int]]:
    """{path: (size, mtime_ns)} of every file in the checkout, less CHECKOUT_IGNORED."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in CHECKOUT_IGNORED]
        for name in files:
            path = Path(folder, name)
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            found[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return found


def tracked_files(root: Path = REPO) -> set[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True).stdout
    return set(filter(None, out.split("\0")))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The session fails if a file appeared, went or changed in the checkout, where tests never
    write (make test's reliability.json and screenshot aside, which it asks for by path). An edit
    to a tracked file fails it only under SCALELAB_STRICT_CHECKOUT=1 (`make test`, CI): elsewhere
    the developer may have made it while the tests ran, and it is reported."""
    before = session.config.stash.get(_CHECKOUT, None)
    if before is None:
        return
    allowed = (str(reliability_path()), str(shown_artifacts_dir()))
    after, tracked = checkout_files(), tracked_files()
    changed = sorted(
        path
        for path in before.keys() | after.keys()
        if before.get(path) != after.get(path) and not str(REPO / path).startswith(allowed)
    )
    strict = os.environ.get("SCALELAB_STRICT_CHECKOUT") == "1"
    edited = [p for p in changed if p in tracked and p in before and p in after and not strict]
    wrote = [p for p in changed if p not in edited]
    session.config.stash[_CHANGED] = (wrote, edited)
    if wrote:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    wrote, edited = config.stash.get(_CHANGED, ([], []))
    if wrote:
        terminalreporter.section("tests wrote into the checkout", sep="!", red=True)
        terminalreporter.line(f"{len(wrote)} path(s) in {REPO} appeared, went or changed: {wrote[:20]}")
    if edited:
        terminalreporter.line(f"tracked files edited during the session (by you, or by a test?): {edited[:20]}")
    path = reliability_path()
    if path.is_file():
        terminalreporter.line(f"fault-test figures: {path}")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty folder with a dvc.yaml marker, so the MLflow store lands inside it."""
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture(scope="session")
def mlflow_schema(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store with its schema made, once per worker (MLflow's migrations take
    seconds, and most tracking tests would otherwise run them on a fresh store)."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-schema") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store_ready(workdir: Path, mlflow_schema: Path) -> Path:
    """`workdir` holding an empty mlflow.db with its schema: what the first MLflow call there
    would make, copied instead of migrated again. Returns workdir."""
    shutil.copy(mlflow_schema, workdir / "mlflow.db")
    return workdir


@pytest.fixture(scope="session")
def prepared_digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/prepared for the default digits source, built once per session (per xdist worker, in
    its own temporary folder). Tests only read it."""
    from scalelab.config import DataConfig, build
    from scalelab.data.prepare import prepare

    out = tmp_path_factory.mktemp("prepared")
    prepare(build(DataConfig, {}), out)
    return out


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A git-committed copy of the repo's tracked files (no results, no mlflow.db)."""
    return copy_repo(tmp_path / "repo")


@pytest.fixture(scope="session")
def trained_pipeline(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """`dvc repro` of prepare, train and evaluate with the default params in a committed copy of the
    repo, left dirty (params.yaml and dvc.yaml rewritten without the study, and
    tracking.system_metrics_interval_s 2.0, tracking.upload_untracked true) with an untracked
    notes.txt. Tests only read it: its files and its mlflow.db (a test that reruns something copies it first).

    Built once per session: under pytest-xdist, the first worker to ask builds it under a lock in
    the session's shared temporary folder, the others wait and reuse it. A marker file is written
    once it is complete (it cannot move: mlflow.db holds absolute artifact paths), so a failed build
    is retried, never taken for a finished one.
    """
    import yaml
    from filelock import FileLock

    from helpers import run_cli, training_pipeline

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker_id != "master" else base  # xdist: the session's folder
    repo, done = shared / "trained-pipeline" / "repo", shared / "trained-pipeline" / "complete"
    with FileLock(shared / "trained-pipeline.lock"):
        if not done.is_file():
            shutil.rmtree(repo, ignore_errors=True)
            copy_repo(repo)
            params = yaml.safe_load((repo / "params.yaml").read_text())
            params["tracking"]["system_metrics_interval_s"] = 2.0
            params["tracking"]["upload_untracked"] = True  # notes.txt goes into the run, for reproduce
            training_pipeline(repo, params)
            (repo / "notes.txt").write_text("an untracked file\n")
            run_cli("dvc", "repro", cwd=repo, timeout=900)
            done.touch()
    return repo


def _is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture(scope="session")
def slurm_cluster() -> dict[str, str]:
    """The local SLURM cluster (slurm/local/): reused if SLURM_CONF points at a live one, else
    installed and started here, which needs root (CI runs as root). One start for all xdist
    workers and sessions: start.sh runs under a lock, and a second run of it is a quick no-op."""
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        if not _is_root():
            pytest.skip("the local SLURM cluster needs root to install and start (slurm/local/start.sh)")
        from filelock import FileLock

        with FileLock("/tmp/scalelab-slurm.lock"):
            subprocess.run([str(REPO / "slurm/local/install.sh")], check=True, capture_output=True)
            subprocess.run([str(REPO / "slurm/local/start.sh")], check=True, capture_output=True)
        conf = "/tmp/scalelab-slurm/slurm.conf"
        os.environ["SLURM_CONF"] = conf
    return {"SLURM_CONF": conf}
