"""Phase timestamps for the start-up benchmark: off unless SCALELAB_TIMINGS names a file.

    SCALELAB_TIMINGS=/tmp/t.jsonl scalelab train --data data/prepared --out results/train

Each `mark(phase)` appends one JSON line {"phase", "t" (Unix time, s), "pid", "rank"} to that
file; every process of the job (launcher, torchrun ranks) appends to the same file, one short
write each (O_APPEND keeps the lines whole). Without the variable a mark costs one dict lookup.
"""

from __future__ import annotations

import json
import os
import time

ENV = "SCALELAB_TIMINGS"


def mark(phase: str) -> None:
    """Appends `phase` with the current time to the SCALELAB_TIMINGS file, if one is named."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"phase": phase, "t": time.time(), "pid": os.getpid(), "rank": int(os.environ.get("RANK", 0))})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
