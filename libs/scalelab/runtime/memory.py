"""This process's resident memory on Linux (/proc/self/status): the study's CPU memory columns and
the benchmarks' per-rank figures read it here."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB: VmRSS, VmHWM (the peak since the last reset), RssAnon."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def reset_peak(trim: bool = False) -> int:
    """Resets VmHWM to the current resident size (Linux >= 4.0) and returns that size in bytes.

    `trim` first returns freed heap memory to the OS (glibc's malloc_trim): otherwise a later
    allocation may reuse it without growing the resident size, and the peak does not see it.
    """
    if trim:
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return 1024 * status_kib("VmRSS")


def peak_since(baseline: int) -> int:
    """Bytes the resident size peaked at above `baseline` (from `reset_peak`)."""
    return 1024 * status_kib("VmHWM") - baseline
