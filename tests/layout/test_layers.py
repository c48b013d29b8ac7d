"""The package's architecture, checked: imports point down the layers, every stage's DVC deps
cover the code its command imports, and each sub-package says what it owns."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from helpers import REPO

PACKAGE = REPO / "libs/scalelab"
# a sub-package may import its own modules and those of lower layers, never a higher or equal one
LAYERS = {
    "runtime": 0,
    "config": 0,
    "storage": 0,
    "data": 1,
    "tracking": 1,
    "launch": 2,
    "training": 3,
    "study": 4,
    "sweeps": 4,
    "bench": 5,
    "reproduce": 5,
    "cli": 6,
}
MAX_LINES = 400


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def package_of(path: Path) -> str | None:
    rel = path.relative_to(PACKAGE).parts
    return rel[0] if len(rel) > 1 else None


def imported(path: Path) -> set[str]:
    """Every scalelab or experiments module that `path` imports, at any depth (lazy imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in ("scalelab", "experiments")}


def source_of(module: str) -> Path | None:
    """The file of a dotted module name (a package's __init__), or None for a non-module name."""
    base = REPO / ("libs" if module.startswith("scalelab") else "") / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_every_module_belongs_to_a_known_layer():
    assert {package_of(p) for p in modules()} - {None} == set(LAYERS)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_the_layers(path):
    own = package_of(path)
    for module in imported(path):
        parts = module.split(".")
        if parts[0] == "experiments":
            pytest.fail(f"{path.name} imports {module}: workloads are found by name (config.registry)")
        target = parts[1] if len(parts) > 1 and parts[1] in LAYERS else None
        if own is None or target is None or target == own:
            continue
        assert LAYERS[target] < LAYERS[own], f"{path.relative_to(REPO)} ({own}) imports {module} ({target})"


def test_experiments_import_only_the_config_layer():
    for path in (REPO / "experiments").glob("*.py"):
        for module in imported(path):
            assert module.startswith(("experiments", "scalelab.config")), f"{path.name} imports {module}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_stay_small(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_sub_package_says_what_it_owns(package):
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
    assert doc and "Owns" in doc or package == "cli", doc


def closure(start: Path) -> set[Path]:
    """The project files reachable from `start` through imports (scalelab and experiments)."""
    seen, todo = set(), [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in imported(path):
            found = source_of(module)
            if found:
                todo.append(found)
                parent = source_of(module.rsplit(".", 1)[0])
                todo += [parent] if parent else []  # importing a.b runs a/__init__.py too
        if path == PACKAGE / "config/registry.py":
            todo += sorted((REPO / "experiments").glob("*.py"))  # workloads, imported by name
    return seen


def is_code(path: Path) -> bool:
    """False for a file that holds only a docstring (libs/scalelab/__init__.py)."""
    body = ast.parse(path.read_text()).body
    return not (len(body) <= 1 and all(isinstance(n, ast.Expr) for n in body))


def folder_of(path: Path) -> str:
    rel = path.relative_to(REPO)
    return rel.parts[0] if rel.parts[0] == "experiments" else "/".join(rel.parts[:3])


STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_deps_cover_every_module_its_command_imports(stage):
    body = STAGES[stage]
    command = body["cmd"].split()[1]  # "scalelab <command> ..."
    entry = PACKAGE / "cli" / f"{command}.py"
    folders = {folder_of(p) for p in closure(entry) | closure(PACKAGE / "cli/__init__.py") if is_code(p)}
    missing = folders - set(body["deps"])
    assert not missing, f"stage {stage} runs code in {sorted(missing)} but does not depend on it"


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_no_stage_lists_a_single_python_file(stage):
    assert not [d for d in STAGES[stage]["deps"] if d.endswith(".py")]


def test_only_tracking_talks_to_mlflow():
    """A second tracking backend replaces tracking/ and nothing else (issue 28): no module outside it
    imports mlflow, lazily or not."""
    outside = []
    for path in modules():
        if package_of(path) == "tracking":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            outside += [f"{path.relative_to(PACKAGE)}: {n}" for n in names if n.split(".")[0] == "mlflow"]
    assert not outside, outside
