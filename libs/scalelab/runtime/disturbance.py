"""How much of the machine other processes took while something was timed, from /proc.

A `Snapshot` holds the CPU time the whole machine spent busy (/proc/stat's first line: user, nice,
system, irq, softirq; steal apart), the CPU time of our own processes (utime + stime of each pid in
/proc/<pid>/stat, all of its threads), and the 1-minute load average. Between two snapshots,
`share(before, after)` is what the others held: (busy - ours) / (elapsed x cores), and the steal
(time a hypervisor gave to other guests) as a share of the same. It sees one machine: on several
nodes, rank 0's. /proc charges CPU time by whole ticks (1/HZ s), a tick per CPU to whatever runs
there, so over a window each CPU's count may be a tick off, both the machine's and ours: the
others' share is a lower bound, with 2 ticks per core taken off. A repeat of a few milliseconds
therefore never reads as busy; one of a second or more on 2 cores reads within 2%.

    before = snapshot([os.getpid()])
    ...  # the timed work
    print(share(before, snapshot([os.getpid()]), cores=os.cpu_count()))
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # ticks per second in /proc


@dataclass(frozen=True)
class Snapshot:
    time_s: float  # time.monotonic()
    busy_ticks: int  # every CPU, every process: user + nice + system + irq + softirq
    steal_ticks: int
    own_ticks: int  # utime + stime of our processes
    load_1m: float


@dataclass(frozen=True)
class Share:
    others: float  # of the machine's cores, 0..1: CPU time of processes not ours
    steal: float  # of the machine's cores, 0..1
    load_1m: float  # at the end

    def as_dict(self) -> dict[str, float]:
        return {"others_cpu_share": self.others, "steal_share": self.steal, "load_1m": self.load_1m}


def cpu_ticks(stat_text: str) -> tuple[int, int]:
    """(busy, steal) ticks of all CPUs from /proc/stat's text."""
    fields = next(line for line in stat_text.splitlines() if line.startswith("cpu ")).split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in (fields + ["0"] * 8)[:8])
    return user + nice + system + irq + softirq, steal  # guest time is inside user already


def process_ticks(pid_stat_text: str) -> int:
    """utime + stime of one /proc/<pid>/stat line (its name, in parentheses, may hold spaces)."""
    after_name = pid_stat_text.rsplit(")", 1)[1].split()
    return int(after_name[11]) + int(after_name[12])  # fields 14 and 15 of proc(5)


def snapshot(pids: list[int], proc: Path = PROC) -> Snapshot:
    """The machine's busy and steal ticks, our `pids`' ticks (a gone pid counts 0), the load."""
    busy, steal = cpu_ticks((proc / "stat").read_text())
    own = 0
    for pid in pids:
        try:
            own += process_ticks((proc / str(pid) / "stat").read_text())
        except (OSError, IndexError, ValueError):
            pass
    load = float((proc / "loadavg").read_text().split()[0])
    return Snapshot(time.monotonic(), busy, steal, own, load)


def share(before: Snapshot, after: Snapshot, cores: int, hz: int = HZ) -> Share:
    """What other processes (at least: the rounding of /proc's ticks taken off) and the
    hypervisor held of the machine between two snapshots."""
    capacity = max(after.time_s - before.time_s, 1e-9) * hz * max(cores, 1)
    others = (after.busy_ticks - before.busy_ticks) - (after.own_ticks - before.own_ticks)
    others -= 2 * max(cores, 1)  # a tick of rounding per core, in the machine's count and in ours
    return Share(
        others=min(max(others / capacity, 0.0), 1.0),
        steal=min(max((after.steal_ticks - before.steal_ticks) / capacity, 0.0), 1.0),
        load_1m=after.load_1m,
    )
