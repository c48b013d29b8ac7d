"""`make test` relies on `--dist loadgroup` to keep the tests of one service on one xdist worker
(tests/conftest.py GROUPS). pytest 9.2 with pytest-xdist 3.8 silently stopped grouping (the group
tag never reached the node ids); this fails if the pinned versions do that again."""

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

GROUPED = """
import pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    pass
"""


def test_tests_of_one_group_run_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider",
         "test_grouped.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,  # three interpreters on a busy CI machine
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    workers = re.findall(r"\[(gw\d)\] \[[ \d]+%\] PASSED test_grouped.py::test_grouped\[\d\]@one", proc.stdout)
    assert len(workers) == 4 and len(set(workers)) == 1, proc.stdout[-2000:]
