"""Where the suite's time goes. With SCALELAB_TEST_CPU=<file>, each test's CPU seconds are written
to <file> as JSON lines (its worker's own, and those of the processes it started and waited for),
and the run's summary names the costliest tests. `make test` keeps every core busy, so what a test
costs the others is its CPU time, not its wall time, which the load stretches. Not counted: the
processes no test waits for (servers kept for a session, SLURM jobs, `dvc queue` workers).

    SCALELAB_TEST_CPU=/tmp/cpu.jsonl make test
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest

REPORT = os.environ.get("SCALELAB_TEST_CPU", "")
TOP = 20  # tests named in the summary


def cpu_s() -> tuple[float, float]:
    """(this process's CPU seconds, its waited-for children's), user and system."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pytest_configure(config: pytest.Config) -> None:
    if REPORT and not hasattr(config, "workerinput"):  # the run's first process: a fresh report
        Path(REPORT).write_text("")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not REPORT:
        return (yield)
    before = cpu_s()
    result = yield
    own, children = (after - start for start, after in zip(before, cpu_s()))
    line = {"test": item.nodeid, "own_s": round(own, 2), "children_s": round(children, 2)}
    with open(REPORT, "a") as f:  # one short write per test: the workers' lines do not interleave
        f.write(json.dumps(line) + "\n")
    return result


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if not REPORT or hasattr(config, "workerinput") or not Path(REPORT).is_file():
        return
    rows = [json.loads(line) for line in Path(REPORT).read_text().splitlines()]
    cost = {row["test"]: row["own_s"] + row["children_s"] for row in rows}
    terminalreporter.write_sep("=", f"CPU: {sum(cost.values()):.0f} s in {len(cost)} tests ({REPORT})")
    for test, seconds in sorted(cost.items(), key=lambda kv: -kv[1])[:TOP]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {test}")
