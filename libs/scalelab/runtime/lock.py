"""One job per output folder: an exclusive lock held for the job's whole life.

`scalelab train` takes it before it writes anything into the folder, and the kernel drops it when
the holder exits, however it ends. A second job on the same folder fails at once, naming the
folder and the holder, and touches nothing.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)


class FolderBusy(RuntimeError):
    """Another job holds the output folder."""

    exit_status = 2  # the CLI's "bad input": pick another --out or wait


class FolderLock:
    """`with FolderLock(folder):` holds `<folder>/.lock` (flock) until the block ends. Busy: raises
    FolderBusy, or with `wait` logs the holder and waits for it."""

    def __init__(self, folder: str | Path, wait: bool = False) -> None:
        self.path = Path(folder) / ".lock"
        self.wait = wait
        self._fh = None

    def __enter__(self) -> FolderLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = self.path.open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            if self.wait:
                log.info("%s is in use by %s: waiting for it", self.path.parent, holder)
                fcntl.flock(fh, fcntl.LOCK_EX)
            else:
                fh.close()
                raise FolderBusy(
                    f"{self.path.parent} is in use by another job ({holder}); wait for it to end or give another --out"
                ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": time.strftime("%FT%T"),
                    "command": " ".join(sys.argv)[:300],
                }
            )
        )
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            self._fh.truncate(0)
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
