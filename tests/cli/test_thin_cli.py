"""The CLI stays a thin shell (DESIGN.md §2): commands read flags and call the library; no function in
``slimpack.cli`` grows past 40 lines (loops, fits and presets live in runtime/, cost/ and config/)."""

from __future__ import annotations

import ast
from pathlib import Path

import slimpack.cli

MAX_LINES = 40


def test_no_cli_function_is_longer_than_40_lines():
    long = []
    for path in sorted(Path(slimpack.cli.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_LINES:
                    long.append(f"{path.name}:{node.name} ({lines} lines)")
    assert not long, long


def test_every_command_shows_its_defaults_in_help(cli, capsys):
    for command, default in (("plan", "tp 8 pp 4 dp 2"), ("compare", "tp 8 pp 4 dp 2"), ("cost", "tp 8 pp 4 dp 2"),
                             ("train", "default: tiny"), ("fidelity", "default: tiny")):
        assert cli([command, "--help"]) == 0
        assert default in " ".join(capsys.readouterr().out.split()), command
