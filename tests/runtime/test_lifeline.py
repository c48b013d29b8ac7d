"""runtime.lifeline: a torchrun worker stops once its launcher is gone (a real orphaned process)."""

import os
import subprocess
import sys

from helpers import wait_for
from scalelab.runtime import lifeline

# the "launcher" starts a worker, waits until it watches its launcher, prints its pid and dies. The
# worker, once it sees itself orphaned, marks it, waits 10 of the watcher's 0.1 s polls (a watcher
# acts at the first poll after the launcher died), then marks that it is still alive and sleeps 60 s
WORKER = """
import os, sys, threading, time
from scalelab.runtime import lifeline
lifeline.exit_with_torchrun(0.1)
launcher = os.getppid()
print("watching", flush=True)
while os.getppid() == launcher:
    time.sleep(0.01)
def mark(text):
    with open(sys.argv[1], "a") as fh:
        fh.write(text + "\\n")
mark("orphaned")
time.sleep(10 * 0.1)
mark("still alive after 10 polls; threads: " + ", ".join(t.name for t in threading.enumerate()))
time.sleep(60)
"""
LAUNCHER = """
import subprocess, sys
proc = subprocess.Popen(
    [sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
)
assert proc.stdout.readline() == "watching\\n"
print(proc.pid, flush=True)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # an exited child not yet reaped by init counts as gone
        return fh.read().split(")")[-1].split()[0] != "Z"


def orphan(env: dict[str, str], marks) -> int:
    """Starts a worker whose launcher has died; returns its pid. It writes its marks to `marks`."""
    cmd = [sys.executable, "-c", LAUNCHER, WORKER, str(marks)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def marked(marks) -> str:
    return marks.read_text() if marks.is_file() else ""


def test_a_torchrun_worker_whose_launcher_died_stops_itself(tmp_path):
    marks = tmp_path / "marks.txt"
    pid = orphan({**os.environ, "TORCHELASTIC_RUN_ID": "t"}, marks)
    try:
        wait_for(lambda: not alive(pid), 15, "the orphaned torchrun worker to stop itself", log=marks)
    finally:
        if alive(pid):
            os.kill(pid, 9)
    # the control of the test below: a watched worker stops before it can mark 10 polls as an orphan
    assert "still alive" not in marked(marks)


def test_outside_torchrun_nothing_is_watched(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert lifeline.exit_with_torchrun() is None
    marks = tmp_path / "marks.txt"
    pid = orphan({k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}, marks)
    try:  # an event: the orphan itself says it lived on past the point where a watched one had stopped
        wait_for(lambda: "still alive" in marked(marks) or not alive(pid), 15, "the unwatched orphan's mark", log=marks)
        assert alive(pid) and "still alive" in marked(marks), f"the unwatched orphan stopped: {marked(marks)!r}"
        assert "scalelab-lifeline" not in marked(marks), marked(marks)
    finally:
        if alive(pid):
            os.kill(pid, 9)
