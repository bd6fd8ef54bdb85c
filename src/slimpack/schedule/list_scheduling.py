"""A dependency-aware order for any pipeline, interleaved or not, found by list scheduling.

Megatron's interleaved 1F1B (``builders.interleaved_1f1b``) fixes its order in advance, which only
works when every backward group is a forward group (it runs backward ``i`` as soon as forward ``i``
has left the last virtual stage). SlimPack's sliced samples and asymmetric backward groups break
that: backward ``i`` needs every forward group holding one of its slices, and a sample's slices
chain forward and backward on every virtual stage (``dag.dependencies``). Here the order is the
trace of a simulated run instead: every device, whenever it is free, starts the action that can
start earliest among its candidates (ties: a backward before a forward, then Megatron's unit order:
groups in rounds of pp, a round through chunk 0 before chunk 1, backwards through the chunks in
reverse). A device runs the forwards of one chunk in group order, and so the backwards, so it has
at most two candidates per chunk.

A device starts a group's first forward only while the activations it keeps, plus what that group
will keep on all of the device's chunks (reserved then: its later chunks must run before any of
its backwards can free memory), stay under its memory cap; when no device can start anything
else, the earliest blocked forward runs anyway (the simulator then
reports the plan's memory, and the planner falls back to another shape). Because the order is a
trace of a run that respected every dependency, it cannot deadlock.
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slimpack.schedule.actions import Action, Order, SliceKey
from slimpack.schedule.dag import ActionKey, dependencies


def list_schedule(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]], *,
                  pp: int, chunks: int, duration: Callable[[ActionKey], float],
                  kept_bytes: Callable[[ActionKey], float], cap_bytes: Sequence[float]) -> Order:
    """Per device, its actions in the order the simulated run started them. ``duration`` and
    ``kept_bytes`` take an action key (kind, group, virtual stage): its seconds, and the activation
    bytes a forward keeps (or a backward frees); ``cap_bytes`` is each device's room for them."""
    num_vstages = pp * chunks
    preds = dependencies(forward, backward, num_vstages=num_vstages)
    counts = {"F": len(forward), "B": len(backward)}
    finish: dict[ActionKey, float] = {}
    free = [0.0] * pp
    live = [0.0] * pp
    reserve = [[sum(kept_bytes(("F", g, c * pp + d)) for c in range(chunks)) for d in range(pp)]
               for g in range(len(forward))]
    """What forward group g will keep on all chunks of device d."""
    orders: list[list[Action]] = [[] for _ in range(pp)]
    # a stream runs one kind of action on one virtual stage in group order; its head is its next
    # action, with the time its predecessors are done (None while one is not placed) and its rank
    streams = [(kind, vstage) for kind in ("B", "F") for vstage in range(num_vstages) if counts[kind]]
    position = dict.fromkeys(streams, 0)
    heads: dict[tuple[str, int], tuple[float | None, tuple, ActionKey] | None] = {}

    def head(stream: tuple[str, int]) -> tuple[float | None, tuple, ActionKey] | None:
        kind, vstage = stream
        group = position[stream]
        if group == counts[kind]:
            return None
        key = (kind, group, vstage)
        ready: float | None = 0.0
        for pred, _ in preds[key]:
            if pred not in finish:
                ready = None
                break
            ready = max(ready, finish[pred])
        chunk = vstage // pp
        # ties: backward first; then Megatron's unit order (rounds of pp groups, chunk by chunk)
        order = (0, group // pp, chunks - 1 - chunk, group % pp) if kind == "B" else (1, group // pp, chunk, group % pp)
        return ready, order, key

    def waiting_on(key: ActionKey) -> tuple[tuple[str, int], ...]:
        """The streams whose head may have been waiting for ``key``."""
        kind, _, vstage = key
        step = 1 if kind == "F" else -1
        near = [(kind, vstage), (kind, vstage + step)]
        if kind == "F" and vstage == num_vstages - 1:
            near.append(("B", vstage))
        return tuple(stream for stream in near if stream in position)

    # Each device's pick changes only when its own time or memory moves (it ran the last action)
    # or one of its streams' heads moves (``waiting_on``), so picks are kept per device and only
    # those devices' streams are looked at again. Ties go to the earlier stream (``streams`` order).
    index = {stream: i for i, stream in enumerate(streams)}
    on_device: list[list[tuple[str, int]]] = [[] for _ in range(pp)]
    for stream in streams:
        heads[stream] = head(stream)
        on_device[stream[1] % pp].append(stream)
    picks: list[tuple[tuple | None, tuple | None]] = [(None, None)] * pp

    def pick(device: int) -> tuple[tuple | None, tuple | None]:
        """The device's (runnable, blocked by its memory cap) action that starts first, each as
        (start, tie order, stream index, key), or None."""
        best = blocked = None
        for stream in on_device[device]:
            entry = heads[stream]
            if entry is None or entry[0] is None:
                continue
            ready, order, key = entry
            rank = (max(ready, free[device]), order, index[stream], key)
            if stream[0] == "F" and stream[1] < pp and live[device] + reserve[key[1]][device] > cap_bytes[device]:
                blocked = rank if blocked is None or rank < blocked else blocked
            elif best is None or rank < best:
                best = rank
        return best, blocked

    stale = set(range(pp))
    remaining = sum(counts.values()) * num_vstages
    while remaining:
        for device in stale:
            picks[device] = pick(device)
        runnable = [p[0] for p in picks if p[0] is not None]
        chosen = min(runnable) if runnable else min((p[1] for p in picks if p[1] is not None), default=None)
        assert chosen is not None, "no action can start: the groups' dependencies form a cycle"
        start, _, _, key = chosen
        kind, group, vstage = key
        device = vstage % pp
        finish[key] = free[device] = start + duration(key)
        if kind == "B":
            live[device] -= kept_bytes(key)
        elif vstage < pp:
            live[device] += reserve[group][device]
        position[(kind, vstage)] += 1
        orders[device].append(Action(kind, group, vstage // pp))  # type: ignore[arg-type]
        stale = {device}
        for stream in waiting_on(key):
            heads[stream] = head(stream)
            stale.add(stream[1] % pp)
        remaining -= 1
    return tuple(tuple(actions) for actions in orders)
