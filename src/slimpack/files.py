"""Reading the project's data files (configs, plans, calibrations): JSON, or TOML by suffix, with
one-line errors that name the file; and where files are written, the folders made first. Must not
import torch."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from slimpack.errors import UserError


def output_path(path: str | Path) -> Path:
    """``path`` with its folders made: every writer goes through here, so an output in a folder that
    does not exist yet is written at the end of a run rather than failing after the work (the CLI
    checks the path before the work and creates nothing, ``slimpack.cli.common.check_output``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def read_data_file(path: str | Path, what: str) -> dict[str, Any]:
    """The parsed content of ``path``, a JSON (or TOML) object (``what`` names it in errors, e.g.
    "config")."""
    path = Path(path)
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not a {kind} text file (it is not UTF-8: binary?)") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{what} {path} is not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path}: expected a {kind} object ({{...}}), got a {type(data).__name__}")
    return data
