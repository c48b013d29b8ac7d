"""No strategy name is compared outside the registry: code asks the strategy object
(`strategies.get(name).distributed`, `strategies.baseline()`, `strategies.reference()`), so a new
strategy is one row in config/strategies.py and one class in training/strategy.py."""

from __future__ import annotations

import ast

import pytest

from helpers import REPO
from scalelab.config import strategies

PACKAGE = REPO / "libs/scalelab"
REGISTRY = {PACKAGE / "config/strategies.py", PACKAGE / "training/strategy.py"}  # where names live
NAMES = set(strategies.STRATEGIES)


def _names_in(node: ast.AST) -> list[str]:
    """The strategy names a comparison's operand spells: a string, or strings in a literal tuple, list or set."""
    if isinstance(node, ast.Constant) and node.value in NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for element in node.elts for n in _names_in(element)]
    return []


def compared_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of each strategy name compared in `source`: `==`, `!=`, `in`, `not in`, a
    pandas `.isin([...])`, or a `case` pattern."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            found += [(node.lineno, n) for operand in operands for n in _names_in(operand)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "isin":
            found += [(node.lineno, n) for arg in node.args for n in _names_in(arg)]
        elif isinstance(node, ast.MatchValue):
            found += [(node.lineno, n) for n in _names_in(node.value)]
    return found


@pytest.mark.parametrize(
    "source",
    [
        'x = 1 if s == "ddp" else 2',
        'ok = "fsdp" != row.strategy',
        'if name in ("single", "dp"): pass',
        'frame[frame.strategy.isin(["ddp_powersgd"])]',
        'match s:\n    case "ddp":\n        pass',
    ],
)
def test_the_check_finds_a_compared_strategy_name(source):
    assert compared_names(source), source


def test_the_check_lets_a_chosen_strategy_name_pass():
    # choosing a strategy by its name is fine: only deciding by a name is the registry's
    assert compared_names('loop = build_loop(wl, device, strategy_name="single")\nARMS = ["ddp", "fsdp"]') == []


def test_no_strategy_name_is_compared_outside_the_registry():
    found = [
        f"{path.relative_to(REPO)}:{line}: compares {name!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in REGISTRY
        for line, name in compared_names(path.read_text())
    ]
    assert not found, (
        "ask the strategy object (config/strategies.py: its facts, baseline(), reference()) instead:\n"
        + "\n".join(found)
    )


def test_the_study_roles_are_held_by_one_strategy_each():
    assert [s.name for s in strategies.STRATEGIES.values() if s.baseline] == [strategies.baseline().name]
    assert [s.name for s in strategies.STRATEGIES.values() if s.reference] == [strategies.reference().name]
    assert not strategies.baseline().parallel and strategies.reference().distributed
