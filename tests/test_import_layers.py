"""The import layers (DESIGN.md §2) hold: a package imports only packages on its own floor or below.

Every ``import slimpack.x`` and ``from slimpack.x import ...`` counts, at module level or inside a
function (a lazy import still ties the floors together).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import slimpack

LAYERS = (
    ("errors", "files", "units", "collector"),
    ("config",),
    ("cost",),
    ("data",),
    ("schedule",),  # action orders, their lowering and graph: values of their own, no plan
    ("plan",),  # plans carry their schedule, resolved with schedule's builders and the cost model
    ("sim",),
    ("strategies",),  # planners simulate candidate plans
    ("compare",),
    ("tune",),  # searches layouts by comparing strategies
    ("api",),  # the Python API: a front for the jobs below (the CLI calls it too)
    ("runtime",),  # torch
    ("integrations",),  # framework adapters; lazily use the runtime's planning loader
    ("cli",),
)
FLOOR = {name: floor for floor, names in enumerate(LAYERS) for name in names}
ROOT = Path(slimpack.__file__).parent


def _package(path: Path) -> str:
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def _imported_packages(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name.split(".")[1] for name in names if name.startswith("slimpack.")}


def upward_imports() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        package = _package(path)
        if package not in FLOOR:
            continue  # __init__ and __main__ of the top package
        for target in sorted(_imported_packages(ast.parse(path.read_text()))):
            if target in FLOOR and FLOOR[target] > FLOOR[package]:
                found.append(f"{path.relative_to(ROOT)} ({package}) imports slimpack.{target}")
    return found


def test_every_package_has_a_floor():
    packages = {_package(p) for p in ROOT.iterdir() if p.name != "__pycache__" and (p.is_dir() or p.suffix == ".py")}
    assert packages - {"__init__", "__main__"} == set(FLOOR)


def test_no_package_imports_a_higher_floor():
    assert upward_imports() == []


def test_the_check_sees_a_back_import(tmp_path, monkeypatch):
    # a schedule module importing the plan (the back-import this test exists to keep out) is reported
    (tmp_path / "schedule").mkdir()
    (tmp_path / "schedule" / "x.py").write_text("def f():\n    from slimpack.plan.types import Plan\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert upward_imports() == ["schedule/x.py (schedule) imports slimpack.plan"]
