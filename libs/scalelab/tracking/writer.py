"""A writer process that stores metric batches in MLflow off the training process.

MLflow's `log_batch` into SQLite is CPU-bound Python (about 0.2 ms per metric plus ~15 ms per
call on the 2-core dev machine). Run in a thread of the training process it would hold the GIL
and stall the training loop (a switch interval, 5 ms, at a time); in its own process it runs on
another core, and the training loop only pays for appending a list to a queue. The child runs at
nice WRITER_NICE: where no core is idle, training gets the CPU first and the writer catches up.

    MLFLOW_TRACKING_URI=... python -c "$CHILD" RUN_ID     # started by ProcessWriter

The tracking URI reaches the child through its environment, never its command line, so a URI
with credentials in it never shows in `ps`.

Protocol: the parent writes one JSON line per batch, `[seq, [[key, value, timestamp_ms, step],
...]]`, to the child's stdin (a feeder thread does the writing, so the training loop never blocks
on a full pipe); the child stores each batch with `log_batch` (retrying with back-off) and prints
`seq` on stdout once it is stored. So `pending()` lists exactly the metrics not yet confirmed.
The child ignores SIGTERM and SIGINT (its parent decides when it ends) and exits at the end of its
input: when the parent closes it, or when the parent dies, after writing what it already read.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from scalelab.runtime.timings import mark

log = logging.getLogger(__name__)
BATCH_METRICS = 1000  # MLflow's limit per log_batch call
BACKOFF_S = 0.5  # the first retry's wait; it doubles up to 16x. SCALELAB_STORE_BACKOFF_S overrides it
WRITER_NICE = 10  # on a machine with no idle core, training gets the CPU first; the writer catches up
CHILD = "import sys; from scalelab.tracking.writer import child; sys.exit(child())"
Row = tuple[str, float, int, int]  # key, value, timestamp (ms), step


class ProcessWriter:
    """Parent side: `submit` never blocks; `pending`, `drain` and `close` follow the child."""

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        self.tracking_uri, self.run_id = tracking_uri, run_id
        self._proc: subprocess.Popen | None = None
        self._outbox: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._unacked: dict[int, list[Row]] = {}
        self._seq = 0

    def _start(self) -> None:
        mark("writer_start")
        env = {**os.environ, "MLFLOW_TRACKING_URI": self.tracking_uri}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, self.run_id],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._feed, args=(self._proc,), name="metric-writer-feed", daemon=True).start()
        threading.Thread(target=self._read_acks, args=(self._proc,), name="metric-writer-acks", daemon=True).start()
        mark("writer_started")  # the child runs; its imports go on beside training

    def _feed(self, proc: subprocess.Popen) -> None:
        try:
            while (item := self._outbox.get()) is not None:
                proc.stdin.write(json.dumps(item) + "\n")
                proc.stdin.flush()
            proc.stdin.close()
        except (OSError, ValueError):  # the child died: its batches stay pending
            pass

    def _read_acks(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            with self._cond:
                self._unacked.pop(int(line), None)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()  # the child ended: wake drain()

    def submit(self, rows: list[Row]) -> None:
        """Queues one batch for the child (started on first use)."""
        if self._proc is None:
            self._start()
        with self._cond:
            self._seq += 1
            self._unacked[self._seq] = [tuple(r) for r in rows]
        self._outbox.put([self._seq, rows])

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def pending(self) -> list[Row]:
        """Metrics submitted but not yet confirmed stored, oldest first."""
        with self._cond:
            return [row for seq in sorted(self._unacked) for row in self._unacked[seq]]

    def take_pending(self) -> list[Row]:
        """Returns the unconfirmed metrics and forgets them (once the child is gone)."""
        with self._cond:
            rows = [row for seq in sorted(self._unacked) for row in self._unacked[seq]]
            self._unacked.clear()
            return rows

    def drain(self, timeout_s: float) -> bool:
        """Waits until every batch is confirmed; False on timeout or once the child has died."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._unacked and self.alive() and (left_s := deadline - time.monotonic()) > 0:
                self._cond.wait(min(left_s, 0.5))
            return not self._unacked

    def close(self, timeout_s: float = 10.0) -> None:
        """Ends the child's input and waits for it to exit (killing it after `timeout_s`)."""
        if self._proc is None:
            return
        self._outbox.put(None)
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def seconds_from_env(name: str, default_s: float) -> float:
    """A wait in seconds from the environment variable `name` (tests shrink waits so), else `default_s`.

    Raises:
        ValueError: naming the variable, its value and what is allowed.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default_s
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise ValueError(f"{name}={raw!r} is not allowed: must be a number of seconds >= 0")
    return value


def backoff_s(attempt: int) -> float:
    """The wait before retry `attempt` + 1: BACKOFF_S (or SCALELAB_STORE_BACKOFF_S) doubling, at most 16x."""
    first_s = seconds_from_env("SCALELAB_STORE_BACKOFF_S", BACKOFF_S)
    return first_s * 2 ** min(attempt, 4)


def store(client: Any, run_id: str, rows: list[Row], attempts: int = 8) -> bool:
    """log_batch in chunks of 1,000, retrying each with back-off (`backoff_s`: 0.5 s doubling to 8 s)."""
    from mlflow.entities import Metric

    metrics = [Metric(key, value, ts, step) for key, value, ts, step in rows]
    for i in range(0, len(metrics), BATCH_METRICS):
        for attempt in range(attempts):
            try:
                client.log_batch(run_id, metrics=metrics[i : i + BATCH_METRICS])
                break
            except Exception as exc:  # the server may be briefly down
                log.warning("MLflow log_batch failed (%s); attempt %d of %d", exc, attempt + 1, attempts)
                if attempt + 1 < attempts:
                    time.sleep(backoff_s(attempt))
        else:
            return False
    return True


def main(argv: list[str]) -> int:
    """The child: stores each batch read from stdin and acknowledges it on stdout."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(WRITER_NICE)
    from mlflow import MlflowClient

    (run_id,) = argv
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    for line in sys.stdin:
        seq, rows = json.loads(line)
        if store(client, run_id, rows):  # a batch never stored stays pending: the parent sends it at finish
            print(seq, flush=True)
    return 0


def child() -> int:
    """The writer process's entry point (CHILD)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s metric-writer: %(message)s")
    status = main(sys.argv[1:])
    # every batch it stored is committed and acknowledged: skip the interpreter's ~1 s teardown
    # (mlflow's and SQLAlchemy's exit handlers), which the job's final flush waits for
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
