"""The one lowering of stage orders into receive / compute / send steps, the walk, and the order in
which the distributed runtime posts its transfers (checked against a model of NCCL's matching)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slimpack.errors import ScheduleError
from slimpack.schedule import Action, Step, Transfer, interleaved_1f1b, lower, one_f_one_b, walk
from slimpack.schedule.builders import dependency_aware
from slimpack.schedule.lowering import link_order


def _order(*stages: str) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(Action.parse(a) for a in stage.split()) for stage in stages)


def test_two_stages_lower_to_the_expected_steps():
    program = lower(_order("F0 B0", "F0 B0"))
    f0, b0 = Action("F", 0), Action("B", 0)
    assert program[0] == (
        Step("compute", f0, 0), Step("send", f0, 0, Transfer("F", 0, 0, 1)),
        Step("recv", b0, 0, Transfer("B", 0, 1, 0)), Step("compute", b0, 0))
    assert program[1] == (
        Step("recv", f0, 1, Transfer("F", 0, 0, 1)), Step("compute", f0, 1),
        Step("compute", b0, 1), Step("send", b0, 1, Transfer("B", 0, 1, 0)))


def test_virtual_stages_wrap_around_the_devices():
    # pp 2, 2 chunks: virtual stages 0 1 2 3 on devices 0 1 0 1; chunk 1 of device 0 is stage 2
    program = lower(_order("F0 F0.1 B0.1 B0", "F0 F0.1 B0.1 B0"), chunks=2)
    f, b = Action("F", 0, 1), Action("B", 0, 1)
    assert program[0][2:5] == (Step("recv", f, 2, Transfer("F", 0, 1, 2)), Step("compute", f, 2),
                               Step("send", f, 2, Transfer("F", 0, 2, 3)))
    assert program[1][3:5] == (Step("recv", f, 3, Transfer("F", 0, 2, 3)), Step("compute", f, 3))  # last: no send
    assert program[1][5:7] == (Step("compute", b, 3), Step("send", b, 3, Transfer("B", 0, 3, 2)))
    assert program[0][-2:] == (Step("recv", Action("B", 0), 0, Transfer("B", 0, 1, 0)),
                               Step("compute", Action("B", 0), 0))  # first: no send


def test_one_stage_has_no_transfers():
    assert lower(_order("F0 F1 B0 B1")) == (tuple(Step("compute", Action.parse(a), 0) for a in ["F0", "F1", "B0", "B1"]),)


def test_a_chunk_that_does_not_exist_is_named():
    with pytest.raises(ScheduleError, match=r"F0\.2 on stage 1: chunk 2 does not exist"):
        lower(_order("F0", "F0.2"), chunks=2)


def test_walk_runs_round_robin_and_numbers_the_sends():
    run = walk(_order("F0 F1 B0 B1", "F0 B0 F1 B1"))
    # pass 4: stage 0 waits at B1 (not sent yet), stage 1 runs B1; pass 5: stage 0 runs B1
    assert run.computes == ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (1, 3), (0, 3))
    assert list(run.transfers) == [Transfer("F", 0, 0, 1), Transfer("F", 1, 0, 1), Transfer("B", 0, 1, 0),
                                   Transfer("B", 1, 1, 0)]


def test_a_deadlock_is_shown_as_a_step_by_stage_grid():
    with pytest.raises(ScheduleError) as info:
        walk(_order("F0 F1 B0 F2 B1 B2", "F0 F1 F2 B0 B1 B2"))
    assert str(info.value) == (
        "pipeline: the order deadlocks: stage 0 at B0 waits for the gradient of B0 from stage 1; "
        "stage 1 at F2 waits for the activation of F2 from stage 0\n"
        "  (+ ran, > waits)\n"
        "  step | stage 0 | stage 1\n"
        "  0    | + F0    | + F0\n"
        "  1    | + F1    | + F1\n"
        "  2    | > B0    | > F2\n"
        "  3    |   F2    |   B0\n"
        "  4    |   B1    |   B1\n"
        "  5    |   B2    |   B2")


def test_a_long_deadlock_grid_leaves_out_the_rows_every_stage_ran():
    good = " ".join(f"F{g} B{g}" for g in range(10))
    with pytest.raises(ScheduleError) as info:
        walk(_order(good + " F10 B10 F11 B11", good + " F10 F11 B10 B11"))
    text = str(info.value)
    assert "(steps 0..17 ran on every stage)" in text and "\n  17 " not in text
    assert "\n  21   | > B10   | > F11\n" in text


def _post_in_order(order, *, chunks=1):
    """Each device's transfers in the order the runtime posts them."""
    run = walk(order, chunks=chunks)
    return run, [link_order(run, d, len(order)) for d in range(len(order))]


def _post_naively(order, *, chunks=1):
    """What the runtime did before: post a send as soon as it is produced, a receive when needed."""
    programs = lower(order, chunks=chunks)
    pp = len(order)
    return None, [tuple(s.transfer for s in program if s.op != "compute" and s.transfer.src % pp != s.transfer.dst % pp)
                  for program in programs]


def _runs_on_nccl(order, posts, *, chunks=1) -> bool:
    """A model of NCCL point-to-point: each device posts its operations in ``posts[d]`` order, following
    its program (a receive is posted at the latest when its action needs it, a send once produced);
    one stream per device, so an operation completes only after every operation posted before it on
    that device, and only once both ends have posted it. True when every program finishes."""
    pp = len(order)
    programs = lower(order, chunks=chunks)
    index = [{t: i for i, t in enumerate(p)} for p in posts]
    position, posted, done_ops = [0] * pp, [0] * pp, [0] * pp  # steps run, ops posted, ops completed
    produced: set[Transfer] = set()
    complete: set[Transfer] = set()
    while True:
        moved = False
        for d in range(pp):
            while position[d] < len(programs[d]):  # run steps until one has to wait
                step = programs[d][position[d]]
                local = step.transfer is not None and step.transfer.src % pp == step.transfer.dst % pp
                if step.op == "recv" and not local:
                    target = index[d][step.transfer]
                    if posted[d] <= target:
                        nxt = posts[d][posted[d]]
                        if nxt.src % pp == d and nxt not in produced:
                            return False  # would post a send it has not produced
                        posted[d] += 1
                        moved = True
                        continue
                    if step.transfer not in complete:
                        break
                elif step.op == "send":
                    produced.add(step.transfer)
                    if not local:
                        while posted[d] <= index[d][step.transfer]:
                            posted[d] += 1
                position[d] += 1
                moved = True
        for d in range(pp):  # complete the head of each device's stream when both ends posted it
            while done_ops[d] < posted[d]:
                transfer = posts[d][done_ops[d]]
                peer = transfer.dst % pp if transfer.src % pp == d else transfer.src % pp
                at_peer = index[peer][transfer]
                if at_peer < posted[peer] and at_peer == done_ops[peer]:
                    complete.add(transfer)
                    done_ops[d] += 1
                    done_ops[peer] += 1
                    moved = True
                else:
                    break
        if all(position[d] == len(programs[d]) for d in range(pp)):
            return True
        if not moved:
            return False


LOOKAHEAD_TRAP = _order("F0 F1 F2 F3 B0 B1 B2 B3", "F0 F1 B0 B1 F2 F3 B2 B3")
"""Stage 0 runs ahead; stage 1 runs two backwards before F2. Both are legal, the order is
deadlock-free with buffered sends, but stage 0's send of F2 waits for stage 1's receive of F2,
posted after stage 1's send of B0, which waits for stage 0's receive of B0, posted after F3."""


def test_naive_posting_deadlocks_on_nccl_and_the_walk_order_does_not():
    walk(LOOKAHEAD_TRAP)  # a valid order
    assert not _runs_on_nccl(LOOKAHEAD_TRAP, _post_naively(LOOKAHEAD_TRAP)[1])
    assert _runs_on_nccl(LOOKAHEAD_TRAP, _post_in_order(LOOKAHEAD_TRAP)[1])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(0, 3), st.booleans(), st.data())
def test_walk_order_posting_finishes_on_nccl(pp, groups, lookahead, interleave, data):
    if interleave and pp > 1:
        groups = pp * max(1, groups // pp)
        chunks = data.draw(st.integers(2, 3))
        order = interleaved_1f1b(groups, pp, chunks)
    else:
        chunks = 1
        need = sorted(data.draw(st.lists(st.integers(1, groups), min_size=groups, max_size=groups)))
        need[-1] = groups
        order = dependency_aware(need, num_forward=groups, pp=pp, lookahead=lookahead)
    run, posts = _post_in_order(order, chunks=chunks)
    for d in range(pp):  # both ends of every link post the same sequence
        for peer in range(pp):
            between = {d, peer}
            assert [t for t in posts[d] if {t.src % pp, t.dst % pp} == between] == \
                   [t for t in posts[peer] if {t.src % pp, t.dst % pp} == between]
    assert _runs_on_nccl(order, posts, chunks=chunks)
    assert sorted(run.computes) == [(d, k) for d in range(pp) for k in range(len(order[d]))]


def test_one_f_one_b_lowers_to_the_transfers_of_every_group():
    run = walk(one_f_one_b(5, 3))
    assert set(run.transfers) == {Transfer(k, g, s, s + 1 if k == "F" else s - 1)
                                  for g in range(5) for k, stages in (("F", (0, 1)), ("B", (2, 1))) for s in stages}
