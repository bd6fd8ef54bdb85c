"""Schedule builders: the per-stage action order of one pipeline. Pure functions of values.

All builders return ``tuple[tuple[Action, ...], ...]`` indexed by pipeline stage (device).
- ``gpipe``: every forward, then every backward (Huang et al., NeurIPS'19).
- ``one_f_one_b``: PipeDream-Flush / Megatron 1F1B (Narayanan et al., SC'21): stage s runs
  pp-s-1 warm-up forwards, then alternates one forward and one backward, then drains.
- ``interleaved_1f1b``: Megatron's interleaved schedule with v model chunks per stage (ibid., §2.2);
  bubble (p-1)/(v·m) of the ideal time.
- ``slice_1f1b``: SlimPipe's 1F1B at slice granularity (Li et al., 2025, arXiv 2504.14519).
- ``dependency_aware``: 1F1B generalised to plans whose backward groups differ from the forward
  groups (asymmetric partitioning) or whose groups hold chained slices of one sample. Before its
  i-th backward a stage must have run every forward that backward group depends on (``need``), and
  otherwise keeps the 1F1B count pp-s+i; an optional ``lookahead`` lets it run that many more
  forwards (so a stage keeps busy while a sliced sample's chain drains), within a memory cap.
  Requiring the same prefix of forwards on every stage makes the order deadlock-free: whatever stage
  s+1 runs before B_i, stage s has already run it (see tests).
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from slimpack.schedule.actions import Action, Order, SliceKey
from slimpack.schedule.dag import slice_table


def gpipe(num_groups: int, pp: int) -> Order:
    stage = tuple(Action("F", g) for g in range(num_groups)) + tuple(Action("B", g) for g in range(num_groups))
    return (stage,) * pp


@lru_cache(maxsize=64)  # every pipeline of a plan with the same number of groups gets the same order
def one_f_one_b(num_groups: int, pp: int) -> Order:
    need = list(range(1, num_groups + 1))
    return dependency_aware(need, num_forward=num_groups, pp=pp)


def backward_needs(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]]) -> list[int]:
    """For each backward group i, how many forward groups must have run before B_i on any stage:
    1 + the last forward group holding a slice of backward groups 0..i (a prefix maximum, because
    backward groups run in order)."""
    _, f_group, b_group = slice_table(forward, backward)
    last_needed = np.full(len(backward), -1)
    np.maximum.at(last_needed, b_group, f_group)
    return np.maximum.accumulate(last_needed + 1).tolist()


def chain_lookahead(need: Sequence[int]) -> int:
    """The look-ahead with which ``dependency_aware`` never holds a backward for its chain: the most
    forwards that a backward needs beyond 1F1B's (backward i needs ``need[i]``, 1F1B has run i + 1).
    SlimPipe's slice-level 1F1B runs a sequence's slices ahead for the same reason."""
    return max(0, max((n - i - 1 for i, n in enumerate(need)), default=0))


def dependency_aware(need: Sequence[int], *, num_forward: int, pp: int, lookahead: int = 0,
                     forward_tokens: Sequence[float] | None = None,
                     backward_tokens: Sequence[float] | None = None,
                     cap_tokens: Sequence[float] | None = None) -> Order:
    """Orders for every stage. ``need[i]``: forwards required before backward i (non-decreasing,
    ending at ``num_forward``). With ``cap_tokens`` (one per stage), a stage stops running extra
    forwards once the tokens whose activations it holds (``forward_tokens`` kept per forward group,
    ``backward_tokens`` released per backward group) would exceed its cap; the cap is in tokens
    because a stage's kept bytes are proportional to its tokens (see
    ``schedule.default.activation_cap_tokens``). Required forwards are never held back, and no stage
    runs fewer forwards before B_i than the stage after it (that is what keeps it deadlock-free)."""
    assert all(a <= b for a, b in zip(need, need[1:], strict=False)), "need must be non-decreasing"
    assert not need or need[-1] == num_forward, "the last backward needs every forward"
    assert cap_tokens is None or (len(cap_tokens) == pp and forward_tokens is not None
                                  and backward_tokens is not None), "a cap needs per-stage caps and group sizes"
    counts_after: list[int] = list(need)  # forwards done before each B on the next stage down the line
    forwards = [Action("F", g) for g in range(num_forward)]  # made once, shared by every stage's order
    backwards = [Action("B", i) for i in range(len(need))]
    orders: list[tuple[Action, ...]] = []
    for stage in reversed(range(pp)):
        # stage s runs at least the forwards of stage s+1 before each backward (below), so it holds
        # at least what s+1 holds: a stage may only fill up to the smallest cap of the stages before it
        cap = min(cap_tokens[:stage + 1]) if cap_tokens is not None else None
        actions: list[Action] = []
        counts: list[int] = []
        done_f, live = 0, 0.0
        for i, required in enumerate(need):
            floor = max(required, counts_after[i])
            target = min(num_forward, max(floor, pp - stage + i) + lookahead)
            while done_f < target:
                extra = forward_tokens[done_f] if forward_tokens is not None else 0.0
                if done_f >= floor and cap is not None and live + extra > cap:
                    break
                actions.append(forwards[done_f])
                live += extra
                done_f += 1
            counts.append(done_f)
            actions.append(backwards[i])
            if backward_tokens is not None:
                live -= backward_tokens[i]
        actions.extend(forwards[done_f:])
        orders.append(tuple(actions))
        counts_after = counts
    return tuple(reversed(orders))


def interleaved_1f1b(num_groups: int, pp: int, chunks: int) -> Order:
    """Megatron's interleaved 1F1B; needs ``num_groups`` to be a multiple of ``pp`` when chunks > 1."""
    if chunks == 1:
        return one_f_one_b(num_groups, pp)
    assert num_groups % pp == 0, "interleaved 1F1B needs the number of groups to be a multiple of pp"
    total = num_groups * chunks

    def unit(k: int, backward: bool) -> Action:
        chunk = (k // pp) % chunks
        group = (k // (pp * chunks)) * pp + k % pp
        if backward:
            return Action("B", group, chunks - 1 - chunk)
        return Action("F", group, chunk)

    orders = []
    for stage in range(pp):
        warmup = min(total, (pp - stage - 1) * 2 + (chunks - 1) * pp)
        actions = [unit(k, False) for k in range(warmup)]
        for i in range(total - warmup):
            actions.append(unit(warmup + i, False))
            actions.append(unit(i, True))
        actions.extend(unit(k, True) for k in range(total - warmup, total))
        orders.append(tuple(actions))
    return tuple(orders)


def slice_1f1b(num_groups: int, pp: int, n: int) -> Order:
    """SlimPipe's slice-level 1F1B (``strategies.slimpipe``), for sequences cut into ``n`` slices each.
    Per stage: n + pp - 1 - s warm-up forwards, then one backward and one forward, then the drain.
    Before backward i every stage has run i + n + pp - 1 - s >= i + n forwards: all the slices of
    the sequence that backward i belongs to (a sequence's backwards start after its n forwards), and
    more than the stage after it, so the order cannot deadlock. n = 1 is plain 1F1B."""
    orders = []
    for stage in range(pp):
        warm_up = min(num_groups, n + pp - 1 - stage)
        actions = [Action("F", g) for g in range(warm_up)]
        for i in range(num_groups):
            actions.append(Action("B", i))
            if warm_up + i < num_groups:
                actions.append(Action("F", warm_up + i))
        orders.append(tuple(actions))
    return tuple(orders)


def order_to_text(order: Order) -> list[str]:
    """One line per stage, actions separated by spaces (e.g. ``F0 F1 B0 F2 B1 B2``)."""
    return [" ".join(str(a) for a in stage) for stage in order]
