"""Random valid pipelines for the runtime tests: samples cut into slices at random points, forward
groups from a random interleaving of the samples' slices (in order), backward groups from another
random interleaving of the slices in reverse order, and random valid action orders."""

from __future__ import annotations

import random
from collections.abc import Sequence

from hypothesis import strategies as st

from slimpack.plan.types import Action, PipelinePlan, Slice


def interleave(per_sample: dict[int, list[Slice]], picks: Sequence[int]) -> list[Slice]:
    """The k-th occurrence of sample s in ``picks`` takes s's k-th slice."""
    taken = {sid: 0 for sid in per_sample}
    out = []
    for sid in picks:
        out.append(per_sample[sid][taken[sid]])
        taken[sid] += 1
    return out


def cut(sequence: list[Slice], cuts: set[int]) -> tuple[tuple[Slice, ...], ...]:
    groups, current = [], []
    for i, item in enumerate(sequence):
        if i in cuts and current:
            groups.append(tuple(current))
            current = []
        current.append(item)
    groups.append(tuple(current))
    return tuple(groups)


@st.composite
def pipelines(draw: st.DrawFn, *, max_samples: int = 4, max_length: int = 120,
              max_cuts: int = 4) -> tuple[PipelinePlan, dict[int, int]]:
    num = draw(st.integers(1, max_samples))
    lengths = {sid: draw(st.integers(1, max_length)) for sid in range(num)}
    per_sample: dict[int, list[Slice]] = {}
    for sid, length in lengths.items():
        points = sorted(draw(st.sets(st.integers(1, max(1, length - 1)), max_size=max_cuts))) if length > 1 else []
        bounds = [0, *points, length]
        per_sample[sid] = [Slice(sid, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
    tickets = [sid for sid, slices in per_sample.items() for _ in slices]
    forward_seq = interleave(per_sample, draw(st.permutations(tickets)))
    forward = cut(forward_seq, draw(st.sets(st.integers(1, len(tickets)), max_size=len(tickets))))
    if draw(st.booleans()):
        backward = forward
    else:
        reversed_slices = {sid: slices[::-1] for sid, slices in per_sample.items()}
        backward_seq = interleave(reversed_slices, draw(st.permutations(tickets)))
        backward = cut(backward_seq, draw(st.sets(st.integers(1, len(tickets)), max_size=len(tickets))))
    return PipelinePlan(replicas=(0,), cp=1, forward=forward, backward=backward), lengths


def random_actions(pipe: PipelinePlan, rng: random.Random) -> list[Action]:
    """Forward groups in order; backward groups in any order the dependencies allow, interleaved
    at random with the forwards. A backward group is ready once its slices have run forward and every
    later slice of their samples outside it has run backward."""
    forwarded: set[Slice] = set()
    backwarded: set[Slice] = set()
    later = {s: {t for g in pipe.forward for t in g if t.sample_id == s.sample_id and t.start > s.start}
             for g in pipe.forward for s in g}
    actions: list[Action] = []
    f = 0
    pending = list(range(len(pipe.backward)))
    while pending:
        ready = [b for b in pending
                 if all(s in forwarded and all(t in backwarded or t in pipe.backward[b] for t in later[s])
                        for s in pipe.backward[b])]
        if f < len(pipe.forward) and (not ready or rng.random() < 0.5):
            actions.append(Action("F", f))
            forwarded.update(pipe.forward[f])
            f += 1
        else:
            assert ready, "no valid backward order"
            b = rng.choice(ready)
            actions.append(Action("B", b))
            backwarded.update(pipe.backward[b])
            pending.remove(b)
    return actions
