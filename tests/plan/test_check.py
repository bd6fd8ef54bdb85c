"""The checker accepts every valid random plan and rejects each kind of broken edit of one, with a
message that names the offending pipeline, pass, sample, token range or action."""

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import config
from random_plans import plans
from slimpack.errors import ScheduleError
from slimpack.plan.check import PlanError, check_groups, check_plan
from slimpack.plan.types import Action, PipelinePlan, Plan, Sample, Slice

SETTINGS = settings(max_examples=60, deadline=None)
PASSES = ("forward", "backward")


def _edit(plan, p, which, groups):
    """The plan with pipeline ``p``'s ``which`` groups replaced (forward edits drop the formations,
    whose count follows the forward groups)."""
    pipe = plan.pipelines[p]
    changes = {which: tuple(tuple(g) for g in groups)}
    if which == "forward":
        changes["formations"] = None
    pipelines = list(plan.pipelines)
    pipelines[p] = dataclasses.replace(pipe, **changes)
    return dataclasses.replace(plan, pipelines=tuple(pipelines))


def _pick_slice(data, plan):
    """(pipeline, pass, group, position) of a random slice."""
    p = data.draw(st.integers(0, len(plan.pipelines) - 1))
    which = data.draw(st.sampled_from(PASSES))
    groups = getattr(plan.pipelines[p], which)
    g = data.draw(st.integers(0, len(groups) - 1))
    k = data.draw(st.integers(0, len(groups[g]) - 1))
    return p, which, g, k


def _rejected(plan, *fragments):
    with pytest.raises((PlanError, ScheduleError)) as info:
        check_plan(plan)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


@SETTINGS
@given(plans())
def test_random_plans_are_valid(plan):
    check_plan(plan)


@SETTINGS
@given(plans(), st.data())
def test_a_dropped_slice_is_named(plan, data):
    p, which, g, k = _pick_slice(data, plan)
    groups = [list(grp) for grp in getattr(plan.pipelines[p], which)]
    sid, start, end = groups[g].pop(k)
    groups = [grp for grp in groups if grp]
    _rejected(_edit(plan, p, which, groups), f"pipelines[{p}].{which}", f"sample {sid} tokens [{start}, {end}) are in no group")


@SETTINGS
@given(plans(), st.data())
def test_duplicated_tokens_are_named(plan, data):
    p, which, g, k = _pick_slice(data, plan)
    groups = [list(grp) for grp in getattr(plan.pipelines[p], which)]
    copy = groups[g][k]
    target = data.draw(st.integers(0, len(groups) - 1))
    groups[target].append(copy)
    _rejected(_edit(plan, p, which, groups), f"pipelines[{p}].{which}",
              f"sample {copy.sample_id} tokens [{copy.start}, {copy.end}) appear twice")


@SETTINGS
@given(plans(), st.data())
def test_overlapping_slices_are_named(plan, data):
    p, which, g, k = _pick_slice(data, plan)
    groups = [list(grp) for grp in getattr(plan.pipelines[p], which)]
    sid, start, end = groups[g][k]
    following = [s for grp in groups for s in grp if s.sample_id == sid and s.start == end]
    assume(following)
    stretch = data.draw(st.integers(1, following[0].tokens))
    groups[g][k] = Slice(sid, start, end + stretch)
    _rejected(_edit(plan, p, which, groups), f"pipelines[{p}].{which}",
              f"sample {sid} tokens [{end}, {end + stretch}) appear twice")


@SETTINGS
@given(plans(), st.data())
def test_slices_swapped_across_groups_break_the_order(plan, data):
    p, which, g, k = _pick_slice(data, plan)
    groups = [list(grp) for grp in getattr(plan.pipelines[p], which)]
    sid = groups[g][k].sample_id
    others = [(h, j) for h, grp in enumerate(groups) for j, s in enumerate(grp) if s.sample_id == sid and h != g]
    assume(others)
    h, j = data.draw(st.sampled_from(others))
    groups[g][k], groups[h][j] = groups[h][j], groups[g][k]
    _rejected(_edit(plan, p, which, groups), f"pipelines[{p}].{which}", f"slices of sample {sid}", "are not in")


@SETTINGS
@given(plans(), st.data())
def test_different_cuts_in_forward_and_backward_are_named(plan, data):
    p, which, g, k = _pick_slice(data, plan)
    groups = [list(grp) for grp in getattr(plan.pipelines[p], which)]
    sid, start, end = groups[g][k]
    following = [(h, j) for h, grp in enumerate(groups) for j, s in enumerate(grp) if s.sample_id == sid and s.start == end]
    assume(following and end - start > 1)
    h, j = following[0]
    cut = end - 1  # move the boundary one token earlier in this pass only
    groups[g][k] = Slice(sid, start, cut)
    groups[h][j] = Slice(sid, cut, groups[h][j].end)
    _rejected(_edit(plan, p, which, groups), f"pipelines[{p}]", f"sample {sid} is cut into different slices")


@SETTINGS
@given(plans(), st.data(), st.booleans())
def test_a_missing_or_repeated_action_is_named(plan, data, repeat):
    p = data.draw(st.integers(0, len(plan.pipelines) - 1))
    order = [list(stage) for stage in plan.pipelines[p].order]
    stage = data.draw(st.integers(0, len(order) - 1))
    k = data.draw(st.integers(0, len(order[stage]) - 1))
    action = order[stage][k]
    if repeat:
        order[stage].insert(data.draw(st.integers(0, len(order[stage]))), action)
        expected = f"stage {stage} runs {action} twice"
    else:
        order[stage].pop(k)
        expected = f"stage {stage} never runs {action}"
    pipelines = list(plan.pipelines)
    pipelines[p] = dataclasses.replace(plan.pipelines[p], order=tuple(tuple(s) for s in order))
    _rejected(dataclasses.replace(plan, pipelines=tuple(pipelines)), f"pipelines[{p}]", expected)


@SETTINGS
@given(plans(), st.data())
def test_a_backward_moved_first_deadlocks(plan, data):
    p = data.draw(st.integers(0, len(plan.pipelines) - 1))
    order = [list(stage) for stage in plan.pipelines[p].order]
    stage = data.draw(st.integers(0, len(order) - 1))
    backward = [a for a in order[stage] if a.kind == "B"]
    action = data.draw(st.sampled_from(backward))
    order[stage].remove(action)
    order[stage].insert(0, action)  # before any forward on this stage: its own forward cannot have run
    pipelines = list(plan.pipelines)
    pipelines[p] = dataclasses.replace(plan.pipelines[p], order=tuple(tuple(s) for s in order))
    _rejected(dataclasses.replace(plan, pipelines=tuple(pipelines)), f"pipelines[{p}]: the order deadlocks")


def _two_sample_plan():
    samples = (Sample(id=0, length=100), Sample(id=1, length=50))
    a = PipelinePlan(replicas=(0,), cp=1, forward=((Slice(0, 0, 100),),), backward=((Slice(0, 0, 100),),))
    b = PipelinePlan(replicas=(1,), cp=1, forward=((Slice(1, 0, 50),),), backward=((Slice(1, 0, 50),),))
    return Plan(config=config(pp=2, dp=2), strategy="test", samples=samples, pipelines=(a, b))


@pytest.mark.parametrize(("edit", "fragment"), [
    (lambda p: dataclasses.replace(p, samples=(*p.samples, Sample(id=0, length=3))), "samples[2]: duplicate sample id 0"),
    (lambda p: dataclasses.replace(p, samples=(Sample(id=0, length=0), p.samples[1])), "sample 0 has length 0"),
    (lambda p: dataclasses.replace(p, deferred=(7,)), "deferred: sample id 7 is not among the samples"),
    (lambda p: dataclasses.replace(p, deferred=(1,)), "pipelines[1].forward[0][0] = [1, 0, 50]: sample 1 is deferred"),
    (lambda p: dataclasses.replace(p, pipelines=(p.pipelines[0],)), "replica(s) [1] run no pipeline"),
    (lambda p: dataclasses.replace(p, pipelines=(p.pipelines[0], dataclasses.replace(p.pipelines[1], replicas=(0,)))),
     "pipelines[1]: replica 0 already runs pipelines[0]"),
    (lambda p: dataclasses.replace(p, pipelines=(p.pipelines[0], dataclasses.replace(p.pipelines[1], replicas=(5,)))),
     "pipelines[1]: replica 5 is out of range 0..1"),
    (lambda p: dataclasses.replace(p, pipelines=(p.pipelines[0], dataclasses.replace(p.pipelines[1], cp=2))),
     "pipelines[1]: cp=2 but 1 merged replica(s)"),
    (lambda p: dataclasses.replace(p, pipelines=(p.pipelines[0], dataclasses.replace(p.pipelines[1], forward=((Slice(9, 0, 5),),)))),
     "pipelines[1].forward[0][0] = [9, 0, 5]: unknown sample id 9"),
    (lambda p: dataclasses.replace(p, pipelines=(p.pipelines[0], dataclasses.replace(p.pipelines[1], forward=((Slice(1, 0, 60),),)))),
     "pipelines[1].forward[0][0] = [1, 0, 60]: range is not within [0, 50)"),
    (lambda p: dataclasses.replace(p, pipelines=(p.pipelines[0], dataclasses.replace(p.pipelines[1], backward=((), (Slice(1, 0, 50),))))),
     "pipelines[1].backward[0]: empty group"),
    (lambda p: dataclasses.replace(p, pipelines=(p.pipelines[0], dataclasses.replace(p.pipelines[1], forward=p.pipelines[0].forward, backward=p.pipelines[0].backward))),
     "pipelines[1]: sample 0 is also scheduled in pipelines[0]"),
    (lambda p: dataclasses.replace(p, pipelines=(p.pipelines[0], dataclasses.replace(p.pipelines[1], formations=("slim", "pack")))),
     "pipelines[1]: 2 formations for 1 forward groups"),
    (lambda p: dataclasses.replace(p, pipelines=(p.pipelines[0], dataclasses.replace(p.pipelines[1], order=((Action("F", 0), Action("B", 0)),)))),
     "pipelines[1]: order has 1 stage(s), the layout has pp=2"),
])
def test_hand_made_errors_are_named(edit, fragment):
    check_plan(_two_sample_plan())
    _rejected(edit(_two_sample_plan()), fragment)


def test_an_interleaved_asymmetric_plan_gets_a_list_scheduled_order_that_checks():
    """A sliced sample with reversed backward groups under vpp 2: interleaved 1F1B cannot run it, so
    the default order is the list-scheduled one; it runs every action once and does not deadlock."""
    forward = ((Slice(0, 0, 5),), (Slice(0, 5, 10),))
    pipe = PipelinePlan(replicas=(0,), cp=1, forward=forward, backward=forward[::-1])
    plan = Plan(config=config(pp=2, vpp=2), strategy="test", samples=(Sample(id=0, length=10),), pipelines=(pipe,))
    check_plan(plan)
    order = plan.pipelines[0].order
    # the slice chain: F0 before F1 on every chunk, B of the later slice (group 0) before B1
    for stage in order:
        for chunk in (0, 1):
            assert stage.index(Action("F", 0, chunk)) < stage.index(Action("F", 1, chunk))
            assert stage.index(Action("B", 0, chunk)) < stage.index(Action("B", 1, chunk))


def _covered_once(plan, sid, length, which):
    """Whether pass ``which`` of the plan covers every token of sample ``sid`` exactly once, in one
    pipeline, counted token by token (the oracle of the test below)."""
    counts, owners = np.zeros(length, dtype=int), set()
    for p, pipe in enumerate(plan.pipelines):
        for s in (s for group in getattr(pipe, which) for s in group if s.sample_id == sid):
            counts[s.start:s.end] += 1
            owners.add(p)
    return bool((counts == 1).all()) and len(owners) == 1, owners


def _in_order(pipe, sid, which):
    """Forward: a sample's slices, by start, in rising (group, position); backward: falling groups
    (rising positions within one)."""
    found = sorted((s.start, g, k) for g, group in enumerate(getattr(pipe, which))
                   for k, s in enumerate(group) if s.sample_id == sid)
    later = (lambda a, b: b > a) if which == "forward" else (lambda a, b: b < a)
    return all(later(g0, g1) or (g0 == g1 and k1 > k0) for (_, g0, k0), (_, g1, k1) in zip(found, found[1:], strict=False))


def _valid_groups(plan):
    """The checker's group rules, restated token by token for small plans."""
    lengths = {s.id: s.length for s in plan.samples}
    if len(lengths) < len(plan.samples) or len(set(plan.deferred)) < len(plan.deferred) \
            or not set(plan.deferred) <= set(lengths):
        return False
    slices = [(p, s) for p, pipe in enumerate(plan.pipelines) for which in PASSES
              for group in getattr(pipe, which) for s in group]
    if any(not group for pipe in plan.pipelines for which in PASSES for group in getattr(pipe, which)):
        return False
    if any(s.sample_id not in lengths or s.sample_id in plan.deferred or not 0 <= s.start < s.end <= lengths[s.sample_id]
           for _, s in slices):
        return False
    for sid, length in lengths.items():
        if sid in plan.deferred:
            continue
        (fwd_ok, fwd_owner), (bwd_ok, bwd_owner) = (_covered_once(plan, sid, length, which) for which in PASSES)
        if not (fwd_ok and bwd_ok and fwd_owner == bwd_owner):
            return False
        pipe = plan.pipelines[fwd_owner.pop()]
        cuts = [sorted((s.start, s.end) for g in getattr(pipe, which) for s in g if s.sample_id == sid) for which in PASSES]
        if cuts[0] != cuts[1] or not all(_in_order(pipe, sid, which) for which in PASSES):
            return False
    return True


@st.composite
def _edited_plans(draw):
    """A random plan after up to three random edits of its slices (most break it, some do not)."""
    plan = draw(plans(max_length=300))
    for _ in range(draw(st.integers(0, 3))):
        p = draw(st.integers(0, len(plan.pipelines) - 1))
        which = draw(st.sampled_from(PASSES))
        groups = [list(g) for g in getattr(plan.pipelines[p], which)]
        places = [(g, k) for g, group in enumerate(groups) for k in range(len(group))]
        if not places:
            continue
        g, k = draw(st.sampled_from(places))
        sid, start, end = groups[g][k]
        edit = draw(st.sampled_from(["drop", "copy", "stretch", "swap", "split", "empty", "rename", "defer"]))
        if edit == "drop":
            groups[g].pop(k)
        elif edit == "copy":
            groups[draw(st.integers(0, len(groups) - 1))].append(groups[g][k])
        elif edit == "stretch":
            groups[g][k] = Slice(sid, max(0, start + draw(st.integers(-3, 3))), end + draw(st.integers(-3, 3)))
        elif edit == "swap":
            h, j = draw(st.sampled_from(places))
            groups[g][k], groups[h][j] = groups[h][j], groups[g][k]
        elif edit == "split" and end - start > 1:
            cut = draw(st.integers(start + 1, end - 1))
            groups[g][k:k + 1] = [Slice(sid, start, cut), Slice(sid, cut, end)]
        elif edit == "empty":
            groups.insert(draw(st.integers(0, len(groups))), [])
        elif edit == "rename":
            groups[g][k] = Slice(sid + draw(st.integers(1, 4)), start, end)
        elif edit == "defer":
            plan = dataclasses.replace(plan, deferred=(*plan.deferred, sid))
        plan = _edit(plan, p, which, groups)
    return plan


@settings(max_examples=300, deadline=None)
@given(_edited_plans())
def test_the_checker_accepts_exactly_the_plans_a_token_count_accepts(plan):
    """The checker works on sorted columns of slices; counting each sample's tokens one by one in
    each pass gives the same verdict, over random plans broken (or not) by chains of edits."""
    try:
        check_groups(plan)
        accepted = True
    except PlanError:
        accepted = False
    assert accepted == _valid_groups(plan)
