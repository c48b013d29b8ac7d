"""A preempted SLURM task waits for its requeue on an event with a deadline (issue 28 fault 5): the
requeue's SIGTERM ends the wait at once; no SIGTERM by the deadline is an error, never a result."""

import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # a Python process importing torch
WAIT = """
import signal, sys, threading, time
from scalelab.runtime.signals import NotRequeued, wait_for_requeue

def announce():  # once the wait's SIGTERM handler is in place
    while signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        time.sleep(0.01)
    print("waiting", flush=True)

threading.Thread(target=announce, daemon=True).start()
try:
    wait_for_requeue(float(sys.argv[1]))
except NotRequeued as exc:
    print(exc, flush=True)
    sys.exit(3)
"""


def start(deadline_s: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WAIT, str(deadline_s)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "waiting"
    return proc


def test_the_requeues_sigterm_ends_the_wait_at_once():
    proc = start(600)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM  # Terminated: well before the 600 s deadline


def test_no_requeue_by_the_deadline_is_an_error():
    proc = start(2)
    assert proc.wait(timeout=60) == 3
    assert "not requeued within 2 s" in proc.stdout.read()
