"""SCALELAB_TEST_CPU (tests/cpu_report.py) counts a test's CPU with the processes it waited for, so
that the suite's costliest tests can be found on a machine whose load stretches every wall time."""

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO

pytestmark = pytest.mark.integration

TESTS = """
import subprocess, sys

def test_spends_cpu_in_a_child():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(6_000_000))"], check=True)

def test_waits_without_cpu():
    subprocess.run(["sleep", "0.5"], check=True)
"""


def test_each_test_gets_its_own_and_its_childrens_cpu_and_the_summary_names_the_costliest(tmp_path):
    (tmp_path / "test_costs.py").write_text(TESTS)
    report = tmp_path / "cpu.jsonl"
    report.write_text('{"test": "from an earlier run"}\n')  # a run starts a fresh report
    env = {**os.environ, "SCALELAB_TEST_CPU": str(report), "PYTHONPATH": str(REPO / "tests")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "cpu_report", "-p", "no:cacheprovider", "-p", "no:randomly",
         "test_costs.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    rows = {row["test"]: row for row in map(json.loads, report.read_text().splitlines())}
    assert set(rows) == {"test_costs.py::test_spends_cpu_in_a_child", "test_costs.py::test_waits_without_cpu"}
    assert rows["test_costs.py::test_spends_cpu_in_a_child"]["children_s"] >= 0.2, rows
    assert rows["test_costs.py::test_waits_without_cpu"]["children_s"] < 0.1, rows
    summary = proc.stdout[proc.stdout.index("CPU: ") :].splitlines()
    assert summary[1].endswith("test_costs.py::test_spends_cpu_in_a_child"), summary
