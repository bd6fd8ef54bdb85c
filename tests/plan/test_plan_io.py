"""Plan files: round trip, and one clear error for each kind of bad file."""

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from random_plans import plans
from slimpack.errors import InvalidPlanError, UserError
from slimpack.plan import load_plan, plan_from_dict, plan_to_dict, save_plan
from slimpack.plan.check import check_plan


@settings(max_examples=40, deadline=None)
@given(plans())
def test_round_trip(tmp_path_factory, plan):
    path = tmp_path_factory.mktemp("plans") / "plan.json"
    save_plan(plan, path)
    assert load_plan(path) == plan
    assert plan_from_dict(json.loads(json.dumps(plan_to_dict(plan)))) == plan


@pytest.fixture
def good(small_plan):
    return plan_to_dict(small_plan)


def _without(data, *path):
    data = copy.deepcopy(data)
    target = data
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return data


def _with(data, value, *path):
    data = copy.deepcopy(data)
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: _without(d, "pipelines"), "plan: missing field 'pipelines'"),
    (lambda d: _without(d, "samples"), "plan: missing field 'samples'"),
    (lambda d: _without(d, "config"), "plan: missing field 'config'"),
    (lambda d: _without(d, "strategy"), "plan: missing field 'strategy'"),
    (lambda d: _without(d, "samples", 0, "length"), "plan.samples[0]: missing field 'length'"),
    (lambda d: _without(d, "pipelines", 0, "backward"), "plan.pipelines[0]: missing field 'backward'"),
    (lambda d: _without(d, "pipelines", 0, "cp"), "plan.pipelines[0]: missing field 'cp'"),
    (lambda d: _without(d, "format"), "plan: field 'format' must be 'slimpack-plan', got None"),
    (lambda d: _with(d, [], "defered"), "plan: unknown field(s) ['defered']"),
    (lambda d: _with(d, 1, "samples", 0, "arrival"), "plan.samples[0]: unknown field(s) ['arrival']"),
    (lambda d: _with(d, None, "pipelines", 1, "orders"), "plan.pipelines[1]: unknown field(s) ['orders']"),
    (lambda d: _with(d, 2, "version"), "plan: plan version 2 is not supported (this slimpack reads 1)"),
    (lambda d: _with(d, "1", "version"), "plan.version: expected int, got '1'"),
    (lambda d: _with(d, 3, "config", "version"), "config version 3 is not supported"),
    (lambda d: _with(d, 3, "config", "parallel", "pp"), "not divisible by pp*virtual_stages"),
    (lambda d: _with(d, "x", "samples", 0, "length"), "plan.samples[0].length: expected int, got 'x'"),
    (lambda d: _with(d, [[[0, 0]]], "pipelines", 0, "forward"), "plan.pipelines[0].forward[0][0]: expected [sample_id, start, end]"),
    (lambda d: _with(d, [[[0, 0, 1.5]]], "pipelines", 0, "forward"), "plan.pipelines[0].forward[0][0]: expected an integer, got 1.5"),
    (lambda d: _with(d, 2**63, "samples", 0, "id"), "plan.samples[0].id: 9223372036854775808 does not fit in a signed 64-bit integer"),
    (lambda d: _with(d, [[[0, 0, -2**70]]], "pipelines", 0, "forward"), "plan.pipelines[0].forward[0][0]: -1180591620717411303424 does not fit"),
    (lambda d: _with(d, 5, "deferred"), "plan.deferred: expected list, got 5"),
    (lambda d: _with(d, "notes", "info"), "plan.info: expected dict, got 'notes'"),
    (lambda d: _with(d, "pack", "pipelines", 0, "formations"), "plan.pipelines[0].formations: expected list"),
    (lambda d: _with(d, ["slim", "tiny"], "pipelines", 0, "formations"), "unknown formation(s) ['tiny']"),
    (lambda d: _with(d, [["F0", 7]], "pipelines", 0, "order"), "plan.pipelines[0].order[0]: expected an action such as"),
    (lambda d: _with(d, [["F0", "X1"]], "pipelines", 0, "order"), "plan.pipelines[0].order[0]: bad action 'X1'"),
])
def test_malformed_files_give_one_clear_error(good, edit, message):
    with pytest.raises(UserError) as info:
        plan_from_dict(edit(good))
    assert not isinstance(info.value, InvalidPlanError)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("slices", "message"), [
    ([[0, 0, 5000]], "pipelines[0].forward[0][0] = [0, 0, 5000]: range is not within [0, 3000) of sample 0"),
    ([[0, -1, 10]], "range is not within"),
    ([[0, 10, 10]], "or is empty"),
    ([[0, 0, 2000], [0, 1000, 3000]], "pipelines[0].forward: sample 0 tokens [1000, 2000) appear twice"),
])
def test_bad_ranges_are_invalid_plans(good, slices, message):
    data = _with(good, [slices], "pipelines", 0, "forward")
    with pytest.raises(InvalidPlanError, match=r".*") as info:
        check_plan(plan_from_dict(data))
    assert message in str(info.value)


def test_unreadable_and_non_json_files(tmp_path):
    with pytest.raises(UserError, match="cannot read plan"):
        load_plan(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="is not valid JSON"):
        load_plan(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(UserError, match="expected a JSON object"):
        load_plan(bad)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=False)
                           | st.text(max_size=4), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*prefix, i))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_corruption_is_a_user_error_or_a_valid_plan(small_plan_dict, data):
    """Replace any one value of a good file by random JSON: reading and checking either succeed or
    raise a ``UserError`` (one line, exit 2 or 1 in the CLI), never another exception."""
    paths = [p for p in _paths(small_plan_dict) if p]
    path = data.draw(st.sampled_from(paths))
    corrupted = _with(small_plan_dict, data.draw(JSON_VALUES), *path)
    try:
        check_plan(plan_from_dict(corrupted))
    except UserError as exc:
        assert "\n" not in str(exc)


def _asymmetric_plan_dict() -> dict:
    """Six 32K-token samples on llama2-7b, tp 1 pp 4, one per forward group, two per backward group:
    stage 0 would run four forwards before its first backward, more activations than an H100 holds,
    so the memory cap (from the config in the file) shapes the default order."""
    from helpers import config
    from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice

    samples = tuple(Sample(id=i, length=32768) for i in range(6))
    groups = tuple((Slice(i, 0, 32768),) for i in range(6))
    pairs = tuple(groups[i] + groups[i + 1] for i in range(0, 6, 2))
    pipe = PipelinePlan(replicas=(0,), cp=1, forward=groups, backward=pairs)
    data = plan_to_dict(Plan(config=config(pp=4, max_context=32768), strategy="test", samples=samples,
                             pipelines=(pipe,)))
    data["pipelines"][0]["order"] = None
    return data


def test_a_file_without_orders_gets_them_once_from_its_own_config():
    from slimpack.cost import CostModel
    from slimpack.plan.types import Action
    from slimpack.schedule import backward_needs, default_order, dependency_aware
    from slimpack.sim import simulate

    plan = plan_from_dict(_asymmetric_plan_dict())
    pipe = plan.pipelines[0]
    assert pipe.order == default_order(pipe.forward, pipe.backward, cp=1, config=plan.config,
                                       cost=CostModel(plan.config))
    uncapped = dependency_aware(backward_needs(pipe.forward, pipe.backward), num_forward=6, pp=4)
    assert pipe.order != uncapped  # the cap, from the file's config, decided the order
    written = plan_to_dict(plan)
    assert written["pipelines"][0]["order"] == [[str(a) for a in stage] for stage in pipe.order]
    assert plan_from_dict(written) == plan
    check_plan(plan)
    # the simulator runs exactly the plan's order on every stage
    spans = [s for s in simulate(plan).spans if s.kind in ("F", "B")]
    for stage, actions in enumerate(pipe.order):
        mine = sorted((s for s in spans if s.stage == stage), key=lambda s: s.start_s)
        assert tuple(Action(s.kind, s.group, s.chunk) for s in mine) == actions
