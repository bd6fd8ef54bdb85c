"""docs/plan.schema.json: real plan files pass it, broken ones fail it, and it names exactly the
fields the writer and the config values have."""

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings

from helpers import REMOVED, edited
from random_plans import plans
from slimpack.config import (
    ClusterConfig,
    EfficiencyConfig,
    ModelConfig,
    ParallelConfig,
    PlannerConfig,
    TrainConfig,
)
from slimpack.plan import plan_to_dict

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "plan.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def test_the_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_a_fixed_plan_file_passes(small_plan_dict):
    VALIDATOR.validate(json.loads(json.dumps(small_plan_dict)))


@settings(max_examples=30, deadline=None)
@given(plans())
def test_random_plans_with_explicit_orders_pass(plan):
    VALIDATOR.validate(json.loads(json.dumps(plan_to_dict(plan))))  # orders are resolved with the plan


@pytest.mark.parametrize(("value", "path"), [
    (REMOVED, ("pipelines",)),
    (REMOVED, ("samples", 0, "length")),
    (2, ("version",)),
    ("plan", ("format",)),
    (0, ("samples", 0, "length")),
    ([[[0, 5]]], ("pipelines", 0, "forward")),
    ([[[0, -1, 5]]], ("pipelines", 0, "forward")),
    ([[[0, 0, 5, 9]]], ("pipelines", 0, "forward")),
    ([[]], ("pipelines", 0, "backward")),
    ([["F0", "X1"]], ("pipelines", 0, "order")),
    (["slim", "tiny"], ("pipelines", 0, "formations")),
    (0, ("pipelines", 0, "cp")),
    ([], ("pipelines", 0, "replicas")),
    ([], ("extra",)),
    (3, ("config", "parallel", "pipelines")),
    ("all", ("config", "train", "recompute")),
])
def test_broken_files_fail(small_plan_dict, value, path):
    assert not VALIDATOR.is_valid(edited(small_plan_dict, path, value))


def _schema_fields(name):
    section = SCHEMA["$defs"][name]
    return set(section["properties"]), set(section.get("required", ()))


@pytest.mark.parametrize(("name", "cls"), [
    ("model", ModelConfig), ("cluster", ClusterConfig), ("parallel", ParallelConfig), ("train", TrainConfig),
    ("efficiency", EfficiencyConfig), ("planner", PlannerConfig),
])
def test_config_sections_match_the_config_values(name, cls):
    fields = dataclasses.fields(cls)
    required = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert _schema_fields(name) == ({f.name for f in fields}, required)


def test_plan_fields_match_the_writer(small_plan_dict):
    assert set(SCHEMA["properties"]) == set(small_plan_dict)
    assert set(SCHEMA["$defs"]["sample"]["properties"]) == set(small_plan_dict["samples"][0])
    assert set(SCHEMA["$defs"]["pipeline"]["properties"]) == set(small_plan_dict["pipelines"][0])
    assert set(SCHEMA["$defs"]["config"]["properties"]) == set(small_plan_dict["config"])


def test_the_example_of_the_format_doc_is_valid(tmp_path, cli, capsys):
    text = (Path(__file__).parents[2] / "docs" / "plan-format.md").read_text()
    example = text.split("```json\n", 1)[1].split("```", 1)[0]
    VALIDATOR.validate(json.loads(example))
    path = tmp_path / "example.json"
    path.write_text(example)
    assert cli(["validate", str(path)]) == 0
    summary = capsys.readouterr().out.split("valid plan: ", 1)[1].strip()
    assert f"`valid plan: {summary}`" in " ".join(text.split())
