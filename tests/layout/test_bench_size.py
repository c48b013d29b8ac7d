"""bench/ stays one harness and thin benchmarks: its size is capped (a ratchet toward issue 28's
"under 2,000 lines": lower it as the package shrinks; a rise is a fix's, named below), and no benchmark compares a
strategy name (it asks the registry: `strategies.get(name).distributed`, `.sharded`, ...)."""

import re

from helpers import REPO

BENCH = REPO / "libs/scalelab/bench"
# 3,898 before the harness, 3,288 after it, 2,515 and 2,380 after two cuts of each benchmark, 2,394 with
# two fixes (scaling's busy curve withheld alone; dvc's goal not counting the validate stage), 2,400 with
# harness.rotated for six hand-written arm orders (slicing tricks), 2,390 after small cleanups; issue 28 item 6
# asks for < 2,000
MAX_LINES = 2390
NAMES = "single|dp|ddp|fsdp"
COMPARE = re.compile(rf"""(==|!=)\s*["']({NAMES})["']|["']({NAMES})["']\s*(==|!=)""")


def test_bench_stays_under_its_line_budget():
    sizes = {
        p.name: len(p.read_text().splitlines())
        for p in BENCH.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }  # noqa: E501
    assert sum(sizes.values()) <= MAX_LINES, sorted(sizes.items(), key=lambda kv: -kv[1])


def test_no_benchmark_compares_a_strategy_name():
    found = [
        f"{p.name}:{i}: {line.strip()}"
        for p in sorted(BENCH.glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if COMPARE.search(line)
    ]  # noqa: E501
    assert not found, found
