"""Shared machinery of the config values: dict round-trip with strict keys.

Every config is a ``@dataclass(frozen=True, slots=True, kw_only=True)`` whose fields are plain
values (int, float, str, bool, tuples) or other configs. ``to_dict``/``from_dict`` are generic so no
config writes its own serialisation.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Self

from slimpack.errors import UserError


class ConfigBase:
    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if value is None and field.default is None:  # unset: TOML has no null, and reading restores it
                continue
            if isinstance(value, ConfigBase):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            out[field.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str | None = None) -> Self:
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise UserError(f"{where}: expected a table/object, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise UserError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(known)}")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            kwargs[name] = _convert(hints[name], value, f"{where}.{name}")
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a required field is missing
            raise UserError(f"{where}: {exc}") from None


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and issubclass(hint, ConfigBase):
        return hint.from_dict(value, where=where)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if value is None else _convert(args[0], value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)[:1]
        return tuple(_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise UserError(f"{where}: {value!r} is not one of {list(typing.get_args(hint))}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not _is_type(value, hint):
        raise UserError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def _is_type(value: Any, hint: type) -> bool:
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def require(condition: bool, message: str) -> None:
    """Raise a ``UserError`` with ``message`` unless ``condition`` holds (validation helper)."""
    if not condition:
        raise UserError(message)
