"""Reading the project's data files (configs, plans, calibrations): JSON, or TOML by suffix, with
one-line errors that name the file. Must not import torch."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from slimpack.errors import UserError


def read_data_file(path: str | Path, what: str) -> Any:
    """The parsed content of ``path`` (``what`` names it in errors, e.g. "config")."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise UserError(f"{what} {path} is not valid {kind}: {exc}") from None
