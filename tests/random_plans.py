"""Hypothesis strategies for random valid plans: random sample lengths, random slicing, random
forward groupings and random backward regroupings that keep each sample's slices in reverse order.

Every plan drawn here passes ``check_plan``; the property tests run it through the real
``CostModel`` and simulator, and the rejection tests break it one edit at a time.
"""

from __future__ import annotations

from hypothesis import strategies as st

from helpers import config
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice


def _interleave(draw, chains: list[list[Slice]]) -> list[Slice]:
    """A random merge of the chains that keeps each chain's own order."""
    queues = [list(chain) for chain in chains if chain]
    out: list[Slice] = []
    while queues:
        k = draw(st.integers(0, len(queues) - 1))
        out.append(queues[k].pop(0))
        if not queues[k]:
            queues.pop(k)
    return out


def _cut(draw, sequence: list[Slice], sort: bool) -> tuple[tuple[Slice, ...], ...]:
    """Cut a sequence into random contiguous, non-empty groups."""
    n = len(sequence)
    splits = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
    bounds = [0, *splits, n]
    groups = [sequence[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    # within a group a sample's slices are listed in data order (the checker's rule for both passes)
    return tuple(tuple(sorted(g) if sort else g) for g in groups)


def _slices(draw, sample: Sample) -> list[Slice]:
    max_cuts = min(3, sample.length - 1)
    cuts = sorted(draw(st.sets(st.integers(1, sample.length - 1), max_size=max_cuts))) if max_cuts > 0 else []
    bounds = [0, *cuts, sample.length]
    return [Slice(sample.id, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]


@st.composite
def pipelines_of(draw, samples: list[Sample], replicas: tuple[int, ...], cp: int) -> PipelinePlan:
    chains = [_slices(draw, s) for s in samples]
    forward = _cut(draw, _interleave(draw, chains), sort=False)
    # forward groups reused as backward groups (plain 1F1B) are legal only without chains
    unchained = all(len({s.sample_id for s in g} & {s.sample_id for s in h}) == 0
                    for i, g in enumerate(forward) for h in forward[i + 1:])
    if unchained and draw(st.booleans()):
        backward = forward
    else:
        backward = _cut(draw, _interleave(draw, [c[::-1] for c in chains]), sort=True)
    formations = draw(st.none() | st.lists(st.sampled_from(["slim", "mix", "pack"]),
                                           min_size=len(forward), max_size=len(forward)).map(tuple))
    return PipelinePlan(replicas=replicas, cp=cp, forward=forward, backward=backward, formations=formations)


@st.composite
def plans(draw, max_samples: int = 7, max_length: int = 40_000) -> Plan:
    """A valid plan on a real layout: pp in {1, 2, 4}, dp in {1, 2, 3}, some samples deferred and,
    with dp > 1, sometimes two replicas merged into one context-parallel pipeline (DP-Merge)."""
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.integers(1, 3))
    cfg = config(pp=pp, dp=dp, max_context=max_length)
    merged = dp > 1 and draw(st.booleans())
    teams = [(0, 1), *((r,) for r in range(2, dp))] if merged else [(r,) for r in range(dp)]
    lengths = draw(st.lists(st.integers(1, max_length), min_size=len(teams), max_size=max_samples))
    samples = [Sample(id=10 + 3 * i, length=n) for i, n in enumerate(lengths)]
    # every pipeline gets at least one sample; the rest go anywhere or are deferred
    owner = list(range(len(teams))) + [draw(st.integers(-1, len(teams) - 1)) for _ in samples[len(teams):]]
    owner = draw(st.permutations(owner))
    pipelines = tuple(
        draw(pipelines_of([s for s, o in zip(samples, owner, strict=True) if o == p], team, len(team)))
        for p, team in enumerate(teams))
    deferred = tuple(s.id for s, o in zip(samples, owner, strict=True) if o == -1)
    return Plan(config=cfg, strategy="random", step=draw(st.integers(0, 5)), samples=tuple(samples),
                deferred=deferred, pipelines=pipelines)
