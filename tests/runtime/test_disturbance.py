"""What other processes took of the machine during a timed repeat, read from /proc: recorded
snapshots (a /proc/stat, /proc/loadavg and /proc/<pid>/stat pair), one of a busy repeat and one of
an idle one, and the real /proc of this machine."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from scalelab.runtime.disturbance import cpu_ticks, process_ticks, share, snapshot
from scalelab.study.busy import why_busy

# /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice
STAT = "cpu  {user} 0 {system} 50000 10 0 {softirq} {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
# /proc/<pid>/stat: pid (comm) state ... utime (14) stime (15) ...; a name with spaces and ')'
PID_STAT = "4242 (cell worker (r0)) R 1 4242 4242 0 -1 4194304 100 0 0 0 {utime} {stime} 0 0 20 0 3 0 1 1 1\n"


def record(folder: Path, *, user: int, system: int, softirq: int = 0, steal: int = 0, utime: int, stime: int) -> Path:
    (folder / "4242").mkdir(parents=True)
    (folder / "stat").write_text(STAT.format(user=user, system=system, softirq=softirq, steal=steal))
    (folder / "loadavg").write_text("2.50 1.75 1.00 3/400 4300\n")
    (folder / "4242/stat").write_text(PID_STAT.format(utime=utime, stime=stime))
    return folder


def shares(tmp_path, after: dict, before: dict = None, seconds: float = 1.0, cores: int = 2):
    """The share between two recorded snapshots `seconds` apart, at 100 ticks per second."""
    before = before or {"user": 1000, "system": 200, "utime": 100, "stime": 10}
    a = snapshot([4242], record(tmp_path / "a", **before))
    b = dataclasses.replace(snapshot([4242], record(tmp_path / "b", **after)), time_s=a.time_s + seconds)
    return share(a, b, cores=cores, hz=100)


def test_a_busy_repeat_is_caught(tmp_path):
    # 1 s on 2 cores (200 ticks): the machine was busy 180 ticks, our rank 60 of them; a tick of
    # rounding per core, in the machine's count and in ours, is taken off (4 ticks)
    got = shares(tmp_path, {"user": 1150, "system": 230, "utime": 150, "stime": 20})
    assert got.others == pytest.approx(116 / 200) and got.steal == 0.0 and got.load_1m == 2.5
    assert why_busy(got.as_dict() | {"repeat_s": 1.0}, max_share=0.25).startswith("others held 58% of the CPU")


def test_an_idle_repeat_is_kept(tmp_path):
    # the machine was busy exactly as long as our rank: nobody else ran
    got = shares(tmp_path, {"user": 1080, "system": 220, "utime": 170, "stime": 40})
    assert got.others == pytest.approx(0.0)
    assert why_busy(got.as_dict(), max_share=0.25) == ""


def test_a_short_repeat_is_not_judged_busy_on_the_rounding_of_ticks(tmp_path):
    # 5 ms on 2 cores is one tick of capacity: the machine's counter moved 4 ticks (one on each core,
    # at each end), our rank's 0 -- what /proc's rounding does to a few ms of our work, no one else's
    got = shares(tmp_path, {"user": 1004, "system": 200, "utime": 100, "stime": 10}, seconds=0.005)
    assert got.others == 0.0 and why_busy(got.as_dict(), max_share=0.25) == ""


def test_a_busy_loop_on_one_of_two_cores_is_half_the_machine(tmp_path):
    # 2 s on 2 cores (400 ticks): another process took a whole core (200 ticks), our rank the other
    got = shares(tmp_path, {"user": 1400, "system": 200, "utime": 300, "stime": 10}, seconds=2.0)
    assert got.others == pytest.approx(196 / 400)
    assert why_busy(got.as_dict(), max_share=0.25) and not why_busy(got.as_dict(), max_share=0.5)


def test_steal_is_counted_apart_and_a_vanished_process_counts_nothing(tmp_path):
    before = {"user": 1000, "system": 200, "steal": 0, "utime": 100, "stime": 10}
    got = shares(tmp_path, {"user": 1000, "system": 200, "steal": 50, "utime": 100, "stime": 10}, before)
    assert got.steal == pytest.approx(0.25) and got.others == 0.0
    assert snapshot([999999], tmp_path / "a").own_ticks == 0  # no such pid: nothing of ours


def test_the_parsers_read_the_fields_proc5_names():
    assert cpu_ticks(STAT.format(user=7, system=3, softirq=2, steal=5)) == (12, 5)
    assert process_ticks(PID_STAT.format(utime=11, stime=4)) == 15


def test_this_machines_proc_reads_and_our_own_busy_loop_is_not_the_others():
    pids = [os.getpid()]
    before = snapshot(pids)
    end = before.time_s + 0.3
    import time

    while time.monotonic() < end:  # our own work: the share of others must not count it
        pass
    after = snapshot(pids)
    got = share(before, after, cores=os.cpu_count() or 1)
    assert after.own_ticks > before.own_ticks and 0.0 <= got.others <= 1.0
