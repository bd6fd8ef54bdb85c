"""Plan files: versioned, self-contained JSON (format described in docs/plan-format.md).

Reading checks the *shape* of the file (fields, types, versions) and names the offending entry;
the semantic checks (coverage, ordering, dependencies) are ``slimpack.plan.check``'s job. A
pipeline whose ``order`` is null gets the default schedule once, as the plan is read (``Plan``
resolves it from the config inside the file), so a plan is written back with every order spelt out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slimpack.config import Config
from slimpack.errors import UserError
from slimpack.files import output_path, read_data_file
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice
from slimpack.schedule.actions import Action

PLAN_FORMAT = "slimpack-plan"
PLAN_VERSION = 1
# Keys a reader knows; anything else is refused (a misspelt optional key would otherwise vanish).
PLAN_KEYS = ("format", "version", "strategy", "step", "config", "samples", "deferred", "pipelines", "info")
SAMPLE_KEYS = ("id", "length", "arrival_step")
PIPELINE_KEYS = ("replicas", "cp", "forward", "backward", "order", "formations")


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "strategy": plan.strategy,
        "step": plan.step,
        "config": plan.config.to_dict(),
        "samples": [{"id": s.id, "length": s.length, "arrival_step": s.arrival_step} for s in plan.samples],
        "deferred": list(plan.deferred),
        "pipelines": [_pipeline_to_dict(p) for p in plan.pipelines],
        "info": dict(plan.info),
    }


def _pipeline_to_dict(pipe: PipelinePlan) -> dict[str, Any]:
    assert pipe.order is not None, "a Plan resolves every pipeline's order when it is made"
    return {
        "replicas": list(pipe.replicas),
        "cp": pipe.cp,
        "forward": [[list(s) for s in group] for group in pipe.forward],
        "backward": [[list(s) for s in group] for group in pipe.backward],
        "order": [[str(a) for a in stage] for stage in pipe.order],
        "formations": None if pipe.formations is None else list(pipe.formations),
    }


def _field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected an object, got {type(data).__name__}")
    if key not in data:
        raise UserError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise UserError(f"{where}.{key}: expected {names}, got {value!r:.60}")
    return value


def _optional(data: dict[str, Any], key: str, kind: type, where: str, default: Any) -> Any:
    """An optional field: ``default`` when absent or null, else checked like a required one."""
    return default if data.get(key) is None else _field(data, key, kind, where)


def _known_keys(data: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise UserError(f"{where}: unknown field(s) {unknown}; valid: {', '.join(keys)}")


INT64 = range(-2**63, 2**63)
"""Ids, lengths and token positions are read into 64-bit arrays (the checker, the simulator)."""


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"{where}: expected an integer, got {value!r:.60}")
    if value not in INT64:
        raise UserError(f"{where}: {value} does not fit in a signed 64-bit integer")
    return value


def _groups(raw: Any, where: str) -> tuple[tuple[Slice, ...], ...]:
    if not isinstance(raw, list):
        raise UserError(f"{where}: expected a list of groups")
    groups = []
    for g, group in enumerate(raw):
        if not isinstance(group, list):
            raise UserError(f"{where}[{g}]: expected a list of slices [sample_id, start, end]")
        slices = []
        for i, item in enumerate(group):
            at = f"{where}[{g}][{i}]"
            if not isinstance(item, list) or len(item) != 3:
                raise UserError(f"{at}: expected [sample_id, start, end], got {item!r:.60}")
            slices.append(Slice(*(_int(v, at) for v in item)))
        groups.append(tuple(slices))
    return tuple(groups)


def _action(value: Any, where: str) -> Action:
    if not isinstance(value, str):
        raise UserError(f"{where}: expected an action such as \"F3\" or \"B3.1\", got {value!r:.60}")
    try:
        return Action.parse(value)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


def plan_from_dict(data: dict[str, Any], *, where: str = "plan") -> Plan:
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a JSON object")
    if data.get("format") != PLAN_FORMAT:
        raise UserError(f"{where}: field 'format' must be {PLAN_FORMAT!r}, got {data.get('format')!r}")
    version = _field(data, "version", int, where)
    if version != PLAN_VERSION:
        raise UserError(f"{where}: plan version {version} is not supported (this slimpack reads {PLAN_VERSION})")
    _known_keys(data, PLAN_KEYS, where)
    config = Config.from_dict(_field(data, "config", dict, where), where=f"{where}.config")
    samples = []
    for i, raw in enumerate(_field(data, "samples", list, where)):
        at = f"{where}.samples[{i}]"
        samples.append(Sample(id=_int(_field(raw, "id", int, at), f"{at}.id"),
                              length=_int(_field(raw, "length", int, at), f"{at}.length"),
                              arrival_step=_optional(raw, "arrival_step", int, at, 0)))
        _known_keys(raw, SAMPLE_KEYS, at)
    deferred = tuple(_int(v, f"{where}.deferred[{i}]")
                     for i, v in enumerate(_optional(data, "deferred", list, where, [])))
    pipelines = []
    for p, raw in enumerate(_field(data, "pipelines", list, where)):
        at = f"{where}.pipelines[{p}]"
        replicas = tuple(_int(v, f"{at}.replicas[{i}]") for i, v in enumerate(_field(raw, "replicas", list, at)))
        _known_keys(raw, PIPELINE_KEYS, at)
        order_raw = _optional(raw, "order", list, at, None)
        order = None
        if order_raw is not None:
            if not all(isinstance(s, list) for s in order_raw):
                raise UserError(f"{at}.order: expected null or a list (per stage) of action lists")
            order = tuple(tuple(_action(a, f"{at}.order[{s}]") for a in stage) for s, stage in enumerate(order_raw))
        formations = _optional(raw, "formations", list, at, None)
        if formations is not None:
            bad = [f for f in formations if f not in ("slim", "mix", "pack")]
            if bad:
                raise UserError(f"{at}.formations: unknown formation(s) {bad}; valid: slim, mix, pack")
            formations = tuple(formations)
        pipelines.append(PipelinePlan(
            replicas=replicas, cp=_int(_field(raw, "cp", int, at), f"{at}.cp"),
            forward=_groups(_field(raw, "forward", list, at), f"{at}.forward"),
            backward=_groups(_field(raw, "backward", list, at), f"{at}.backward"),
            order=order, formations=formations))
    return Plan(config=config, strategy=_field(data, "strategy", str, where),
                step=_optional(data, "step", int, where, 0), samples=tuple(samples),
                deferred=deferred, pipelines=tuple(pipelines), info=_optional(data, "info", dict, where, {}))


def save_plan(plan: Plan, path: str | Path) -> None:
    output_path(path).write_text(json.dumps(plan_to_dict(plan), separators=(",", ":")) + "\n")


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(read_data_file(path, "plan"), where=str(path))
