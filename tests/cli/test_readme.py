"""The README's "Try it" commands run as written."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _try_it_commands() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Try it"):]
    block = section[section.index("```sh\n") + len("```sh\n"):]
    return [line for line in block[:block.index("```")].splitlines() if line.strip()]


def test_the_try_it_block_is_found():
    commands = _try_it_commands()
    assert len(commands) >= 5 and all(c.startswith("slimpack ") for c in commands)


@pytest.mark.slow
def test_readme_commands_run_as_written(cli, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the commands write plan.json and gantt.png where they run
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for command in _try_it_commands():
        argv = shlex.split(command)[1:]
        if argv[0] == "train" and importlib.util.find_spec("torch") is None:
            continue
        assert cli(argv) == 0, f"{command}: {capsys.readouterr().err}"
    assert (tmp_path / "plan.json").exists() and (tmp_path / "gantt.png").exists()
