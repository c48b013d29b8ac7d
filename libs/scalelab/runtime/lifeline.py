"""A rank never outlives its launcher: a torchrun worker whose torchrun is gone stops itself.

("torchrun" here is torchrun's elastic agent, which runs inside the launcher: launch.local.run_agent.)

torchrun starts each worker in a session of its own, so a signal to the launcher's process group
(a CI timeout, `kill -9 -- -PGID` on `dvc repro`, the OOM killer) does not reach the ranks. Left
alone they would train on with no launcher holding the output folder's lock (runtime.lock),
write checkpoints and outputs DVC never records, and race the rerun in the same folder.
`exit_with_torchrun()` watches the parent process of a torchrun worker; once the worker is
reparented (torchrun died), it sends itself SIGTERM, which `raise_on_sigterm` turns into a KILLED
run (training) and which ends a study cell.
"""

from __future__ import annotations

import os
import signal
import threading
import time


def exit_with_torchrun(interval_s: float = 0.5) -> threading.Thread | None:
    """Under torchrun (TORCHELASTIC_RUN_ID set), starts a daemon thread that sends this process
    SIGTERM once its parent, torchrun, has died; elsewhere does nothing."""
    if not os.environ.get("TORCHELASTIC_RUN_ID"):
        return None
    parent = os.getppid()  # torchrun; init (1) when torchrun died before this rank got here

    def watch() -> None:
        while os.getppid() == parent != 1:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="scalelab-lifeline", daemon=True)
    thread.start()
    return thread
