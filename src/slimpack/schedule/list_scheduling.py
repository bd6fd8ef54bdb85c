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

import math
from collections.abc import Callable, Sequence

from slimpack.schedule.actions import Action, Order, SliceKey
from slimpack.schedule.dag import dependencies


def list_schedule(forward: Sequence[Sequence[SliceKey]], backward: Sequence[Sequence[SliceKey]], *,
                  pp: int, chunks: int, durations: Callable[[str, int], Sequence[float]],
                  kept_bytes: Callable[[str, int], Sequence[float]], cap_bytes: Sequence[float]) -> Order:
    """Per device, its actions in the order the simulated run started them. ``durations`` and
    ``kept_bytes`` take a kind of action and a virtual stage and give, per group, its seconds
    there and the activation bytes its forward keeps (or its backward frees); ``cap_bytes`` is each
    device's room for them."""
    num_vstages = pp * chunks
    counts = {"F": len(forward), "B": len(backward)}
    free = [0.0] * pp
    live = [0.0] * pp
    kept_forward = [kept_bytes("F", vstage) for vstage in range(num_vstages)]
    reserve = [[sum(kept_forward[c * pp + d][g] for c in range(chunks)) for d in range(pp)]
               for g in range(len(forward))]
    """What forward group g will keep on all chunks of device d."""
    orders: list[list[Action]] = [[] for _ in range(pp)]
    # a stream runs one kind of action on one virtual stage in group order; its head is its next
    # action, with the time its predecessors are done (None while one is not placed) and its tie.
    # Streams are numbered (ties go to the earlier one), and every per-action table is a list
    # indexed by stream and group: this loop runs once per action of every candidate pipeline.
    streams = [(kind, vstage) for kind in ("B", "F") for vstage in range(num_vstages) if counts[kind]]
    number = {stream: i for i, stream in enumerate(streams)}
    position = [0] * len(streams)
    needs = dependencies(forward, backward, streams, num_vstages=num_vstages)
    first, p2p_source, data_needs, data_base = needs.first, needs.p2p_source, needs.data, needs.data_base
    finish: list[float | None] = [None] * first[-1]
    """Per action number, when it ends (None: not placed yet)."""
    # every device of a chunk runs the same Action objects, made once (in C) per kind, chunk and group
    made = {(kind, chunk): [tuple.__new__(Action, (kind, group, chunk)) for group in range(counts[kind])]
            for kind in counts for chunk in range(chunks)}
    actions = [made[(kind, vstage // pp)] for kind, vstage in streams]
    seconds = [durations(kind, vstage) for kind, vstage in streams]
    frees = [kept_bytes(kind, vstage) if kind == "B" else () for kind, vstage in streams]
    device_of = [vstage % pp for _, vstage in streams]
    # a forward of a device's first chunk reserves what its group will keep on all the device's chunks
    reserves = [kind == "F" and vstage < pp for kind, vstage in streams]
    backwards = [kind == "B" for kind, _ in streams]
    num_groups = [counts[kind] for kind, _ in streams]
    # Ties: a backward first; then Megatron's unit order (rounds of pp groups, a round through chunk
    # 0 before chunk 1 for forwards, through the chunks in reverse for backwards); then the earlier
    # stream. Each action's place in that order is one integer, its tie: the digits (kind, round,
    # chunk, group within the round, stream) in mixed radix, so ties compare as those tuples do and
    # the lowest digit, tie % num_streams, names the stream. A rank is then (start, tie).
    num_streams, rounds = len(streams), max(counts.values()) // pp + 1
    unit_order = {(kind, chunk): [((((kind == "F") * rounds + group // pp) * chunks
                                    + (chunk if kind == "F" else chunks - 1 - chunk)) * pp + group % pp) * num_streams
                                   for group in range(counts[kind])]
                  for kind in counts for chunk in range(chunks)}
    ties = [unit_order[(kind, vstage // pp)] for kind, vstage in streams]
    """Per stream and group, the action's tie less its stream number."""

    def head(stream: int) -> tuple[float | None, int, int] | None:
        """The stream's next action: (when its predecessors are done, None while one is not placed;
        its tie; its group), or None once the stream has run every group."""
        group = position[stream]
        if group == num_groups[stream]:
            return None
        source = p2p_source[stream]
        ready = 0.0 if source < 0 else finish[source + group]
        if ready is not None:
            base = data_base[stream]
            for other in data_needs[stream].get(group, ()):
                done = finish[base + other]
                if done is None:
                    ready = None
                    break
                if done > ready:  # (not ``max``: this runs for every predecessor of every action)
                    ready = done
        return ready, ties[stream][group] + stream, group

    def waiting_on(kind: str, vstage: int) -> tuple[int, ...]:
        """The other streams whose head may have been waiting for an action of stream (kind, vstage)."""
        step = 1 if kind == "F" else -1
        near = [(kind, vstage + step)]
        if kind == "F" and vstage == num_vstages - 1:
            near.append(("B", vstage))
        return tuple(number[stream] for stream in near if stream in number)

    waiters = [waiting_on(kind, vstage) for kind, vstage in streams]

    # Picks are kept per device: a device's pick changes only when it runs an action (its time,
    # memory and one of its heads move: all its streams are looked at again) or when a head of
    # one of its streams becomes ready (``waiters``: the device is picked again).
    # A head's rank on its device is (its start: when it is ready or the device is free, whichever
    # is later; its tie); the memory cap holds back a first-chunk forward whose group would not fit.
    heads = [head(stream) for stream in range(num_streams)]
    on_device: list[list[int]] = [[] for _ in range(pp)]
    for stream, device in enumerate(device_of):
        on_device[device].append(stream)
    # per device, its runnable action and its action blocked by the memory cap that start first,
    # each as (start, tie), or ``nothing``, which ranks after every action
    nothing = (math.inf, 0)
    runnable: list[tuple[float, int]] = [nothing] * pp
    held_back: list[tuple[float, int]] = [nothing] * pp

    def pick(device: int) -> None:
        best = blocked = nothing
        at, kept, cap = free[device], live[device], cap_bytes[device]
        for stream in on_device[device]:
            entry = heads[stream]
            if entry is None:
                continue
            ready, tie, group = entry
            if ready is None:
                continue
            rank = (ready if ready >= at else at, tie)
            if reserves[stream] and kept + reserve[group][device] > cap:
                if rank < blocked:
                    blocked = rank
            elif rank < best:
                best = rank
        runnable[device], held_back[device] = best, blocked

    for device in range(pp):
        pick(device)
    remaining = sum(counts.values()) * num_vstages
    while remaining:
        # the earliest runnable action, else the earliest blocked one
        chosen = min(runnable)
        if chosen is nothing:
            chosen = min(held_back)
            assert chosen is not nothing, "no action can start: the groups' dependencies form a cycle"
        start, tie = chosen
        stream = tie % num_streams
        group = position[stream]
        device = device_of[stream]
        finish[first[stream] + group] = free[device] = start + seconds[stream][group]
        if backwards[stream]:
            live[device] -= frees[stream][group]
        elif reserves[stream]:
            live[device] += reserve[group][device]
        position[stream] += 1
        orders[device].append(actions[stream][group])
        # the stream's own head moved on; another stream's head can only have moved from not ready
        # to ready (a head whose inputs were all done keeps its readiness), and then its device,
        # whose time and memory have not moved since its last pick, is picked again; so is the
        # device that ran the action
        heads[stream] = head(stream)
        for other in waiters[stream]:
            entry = heads[other]
            if entry is None or entry[0] is not None:
                continue
            heads[other] = entry = head(other)
            if entry[0] is not None and device_of[other] != device:
                pick(device_of[other])
        pick(device)
        remaining -= 1
    return tuple(tuple(actions) for actions in orders)
