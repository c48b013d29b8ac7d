"""runtime.lifeline: a torchrun worker stops once its launcher is gone (a real orphaned process)."""

import os
import subprocess
import sys
import time

from scalelab.runtime import lifeline

# the "launcher" starts a worker, waits until it watches its launcher, prints its pid and dies; the
# worker would sleep 60 s
LAUNCHER = """
import subprocess, sys
worker = (
    "from scalelab.runtime import lifeline; import time; lifeline.exit_with_torchrun(0.1); "
    "print('watching', flush=True); time.sleep(60)"
)
proc = subprocess.Popen([sys.executable, "-c", worker], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
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


def orphan_lives_for(env: dict[str, str], wait_s: float) -> bool:
    out = subprocess.run([sys.executable, "-c", LAUNCHER], env=env, capture_output=True, text=True, check=True)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + wait_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    still = alive(pid)
    if still:
        os.kill(pid, 9)
    return still


def test_a_torchrun_worker_whose_launcher_died_stops_itself():
    assert not orphan_lives_for({**os.environ, "TORCHELASTIC_RUN_ID": "t"}, wait_s=15)


def test_outside_torchrun_nothing_is_watched(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert lifeline.exit_with_torchrun() is None
    # 10 of the watcher's 0.1 s polls: a watched worker would have stopped by then (the test above)
    assert orphan_lives_for({k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}, wait_s=1)
