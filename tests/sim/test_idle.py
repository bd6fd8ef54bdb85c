"""The idle-time split of a simulated step, on closed-form pipelines."""

import pytest

from helpers import UniformCost, config, one_sample_per_group_plan
from slimpack.sim import simulate
from slimpack.sim.idle import idle_split, split_spans
from slimpack.sim.result import Span


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 9), (8, 3)])
def test_balanced_1f1b_idles_only_in_fill_and_drain(p, m):
    cfg = config(pp=p)
    result = simulate(one_sample_per_group_plan(cfg, m), UniformCost(cfg, 1.0, 2.0))
    split = idle_split(result)
    # 1F1B with equal groups: the whole bubble, (p - 1) / (m + p - 1), is fill/drain
    assert split.fill_drain == pytest.approx((p - 1) / (m + p - 1))
    assert split.replica_wait == split.throttled == split.imbalance == 0.0


def _span(pipeline, stage, kind, group, start, end):
    return Span(pipeline, stage, kind, group, 0, start, end, 1)


def test_imbalance_replica_wait_and_throttling_by_hand():
    # pipeline 0, pp 2, two groups; group 0's forward on stage 1 is slow (3 s instead of 1 s):
    # stage 0: F0 0-1, F1 1-2, [idle 2-7], B0 7-9, [idle 9-10], B1 10-12
    # stage 1: [idle 0-1], F0 1-4, B0 4-7 (waits on nothing), F1 7-8, B1 8-10, [idle 10-12]
    pipeline0 = [_span(0, 0, "F", 0, 0, 1), _span(0, 0, "F", 1, 1, 2), _span(0, 0, "B", 0, 7, 9),
                 _span(0, 0, "B", 1, 10, 12),
                 _span(0, 1, "F", 0, 1, 4), _span(0, 1, "B", 0, 4, 7), _span(0, 1, "F", 1, 7, 8),
                 _span(0, 1, "B", 1, 8, 10)]
    # pipeline 1 ends at 6: its devices wait 6 s each for pipeline 0 (replica wait)
    pipeline1 = [_span(1, 0, "F", 0, 0, 1), _span(1, 0, "B", 0, 4, 6), _span(1, 1, "F", 0, 1, 2),
                 _span(1, 1, "B", 0, 2, 4)]
    split = split_spans(pipeline0 + pipeline1, 2, {})
    device_time = 4 * 12
    # pipeline 0, stage 0: busy 6 over 12, idle 6; a balanced pipeline of 2 groups idles
    # (pp - 1) / 2 x 6 = 3 (fill/drain); the other 3 (gaps 2-7 and 9-10, no forward left to run) are
    # imbalance. Stage 1: busy 9, idle 3, all within the balanced bubble 4.5.
    # pipeline 1 (one group): busy 3 and idle 3 on each device before its own end, bubble 1/1 x 3
    assert split.fill_drain == pytest.approx((3 + 3 + 3 + 3) / device_time)
    assert split.imbalance == pytest.approx(3 / device_time)
    assert split.replica_wait == pytest.approx((6 + 6) / device_time)
    assert split.throttled == 0.0
    assert split.total == pytest.approx(1 - (6 + 9 + 3 + 3) / device_time)


def test_a_held_forward_counts_as_throttled():
    # pp 2, four groups; stage 0 holds F2 until B0 although its input is always there
    spans = [_span(0, 0, "F", 0, 0, 1), _span(0, 0, "F", 1, 1, 2), _span(0, 0, "B", 0, 10, 12),
             _span(0, 0, "F", 2, 12, 13), _span(0, 0, "B", 1, 13, 15), _span(0, 0, "F", 3, 15, 16),
             _span(0, 0, "B", 2, 16, 18), _span(0, 0, "B", 3, 18, 20),
             _span(0, 1, "F", 0, 1, 2), _span(0, 1, "B", 0, 8, 10), _span(0, 1, "F", 1, 10, 11),
             _span(0, 1, "B", 1, 11, 13), _span(0, 1, "F", 2, 13, 14), _span(0, 1, "B", 2, 14, 16),
             _span(0, 1, "F", 3, 16, 17), _span(0, 1, "B", 3, 17, 19)]
    split = split_spans(spans, 2, {})
    # stage 0: busy 12 over 20, idle 8; bubble 1/4 x 12 = 3; excess 5; its gap 2-10 had F2 ready
    # (stage 0's input is always there): throttled 5, the rest of the gap is the bubble
    # stage 1: busy 12, idle 8 (0-1, 2-8, 19-20); bubble 3; excess 5; gap 2-8 before B0: the next
    # forward F1's input was there at 2 (stage 0's F1 ended at 2): throttled 5
    assert split.fill_drain == pytest.approx(6 / 40)
    assert split.throttled == pytest.approx(10 / 40)
    assert split.imbalance == 0.0
