"""The one lowering of a stage's actions into receive / compute / send steps.

Chunk c of device (pipeline stage) d is virtual stage v = c·pp + d; virtual stages 0..last run
the model's layers in order. The rule, written here and nowhere else: **F on virtual stage v
receives the group's activation from v−1 and sends its output to v+1; B on v receives the output
gradient from v+1 and sends its input gradient to v−1** (the first virtual stage receives no
activation and sends no gradient, the last sends no activation and receives no gradient).

- ``input_source`` / ``lower_action`` / ``lower`` apply the rule: the graph builder
  (``schedule.dag``), and through it the simulator, and both runtime drivers read it from here.
- ``walk`` runs the lowered programs of every stage in a fixed round-robin (each stage takes its
  next action once its input has been sent). Its order of computes is what the single-process
  driver runs; its order of sends numbers every transfer, and the distributed driver posts each
  rank's sends and receives in that order, so the two ends of every link see the same sequence
  (NCCL matches point-to-point operations by order, not by tag). An order in which no stage can
  move deadlocks: ``ScheduleError`` shows where each stage stands as a step × stage grid.
  ``link_order`` is a device's share of that numbering.
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from slimpack.errors import ScheduleError
from slimpack.schedule.actions import Action


class Transfer(NamedTuple):
    """One tensor handed between virtual stages: the activation of F ``group`` (kind ``F``) or the
    gradient of B ``group`` (kind ``B``), from virtual stage ``src`` to ``dst``."""

    kind: Literal["F", "B"]
    group: int
    src: int
    dst: int


class Step(NamedTuple):
    """One step of a stage's program: receive the input, compute the action, or send the output."""

    op: Literal["recv", "compute", "send"]
    action: Action
    vstage: int
    """The virtual stage running ``action``."""
    transfer: Transfer | None = None
    """What a recv/send step moves (None for compute)."""


def input_source(kind: str, vstage: int, num_vstages: int) -> int | None:
    """The virtual stage an action's input comes from; None when it has none."""
    if kind == "F":
        return vstage - 1 if vstage > 0 else None
    return vstage + 1 if vstage < num_vstages - 1 else None


def output_destination(kind: str, vstage: int, num_vstages: int) -> int | None:
    """The virtual stage an action's output goes to; None when it has none. The mirror of
    ``input_source``: F flows up the pipeline, B flows down."""
    if kind == "F":
        return vstage + 1 if vstage < num_vstages - 1 else None
    return vstage - 1 if vstage > 0 else None


def lower_action(action: Action, device: int, *, pp: int, chunks: int) -> tuple[Step, ...]:
    """``action`` on ``device`` as its receive (if any), compute and send (if any) steps."""
    if not 0 <= action.chunk < chunks:
        raise ScheduleError(f"{action} on stage {device}: chunk {action.chunk} does not exist "
                            f"({chunks} chunk(s) per stage)")
    vstage, num = action.chunk * pp + device, pp * chunks
    steps = []
    src = input_source(action.kind, vstage, num)
    if src is not None:
        steps.append(Step("recv", action, vstage, Transfer(action.kind, action.group, src, vstage)))
    steps.append(Step("compute", action, vstage))
    dst = output_destination(action.kind, vstage, num)
    if dst is not None:
        steps.append(Step("send", action, vstage, Transfer(action.kind, action.group, vstage, dst)))
    return tuple(steps)


def lower(order: Sequence[Sequence[Action]], *, chunks: int = 1) -> tuple[tuple[Step, ...], ...]:
    """Each stage's order as one flat program of steps (``order[d]`` is device d's action list)."""
    pp = len(order)
    return tuple(tuple(step for action in actions for step in lower_action(action, device, pp=pp, chunks=chunks))
                 for device, actions in enumerate(order))


@dataclass(frozen=True, slots=True)
class Walk:
    """A deadlock-free execution of every stage's order (see ``walk``)."""

    computes: tuple[tuple[int, int], ...]
    """(device, index of the action in that device's order), in the order they ran."""
    transfers: Mapping[Transfer, int]
    """Each transfer's sequence number: the order in which their sends ran."""


def walk(order: Sequence[Sequence[Action]], *, chunks: int = 1, where: str = "pipeline") -> Walk:
    """Run the lowered orders round-robin: stage 0, 1, ..., pp−1, again, each taking its next action
    when that action's input has been sent. Raises ``ScheduleError`` (with a grid) when no stage
    can move before every order is done."""
    pp = len(order)
    programs = [[lower_action(a, device, pp=pp, chunks=chunks) for a in actions]
                for device, actions in enumerate(order)]
    position = [0] * pp
    sent: dict[Transfer, int] = {}
    computes: list[tuple[int, int]] = []
    while True:
        moved = False
        for device, program in enumerate(programs):
            if position[device] == len(program):
                continue
            steps = program[position[device]]
            first = steps[0]
            if first.op == "recv" and first.transfer not in sent:
                continue
            computes.append((device, position[device]))
            for step in steps:
                if step.op == "send":
                    sent[step.transfer] = len(sent)  # type: ignore[index]
            position[device] += 1
            moved = True
        if all(position[d] == len(p) for d, p in enumerate(programs)):
            return Walk(computes=tuple(computes), transfers=sent)
        if not moved:
            waits = {}
            for device, program in enumerate(programs):
                if position[device] < len(program):
                    transfer = program[position[device]][0].transfer
                    assert transfer is not None
                    waits[device] = f"the {_what(transfer)} from {_where(transfer.src, pp)}"
            raise ScheduleError(deadlock_message(order, position, waits, where=where))


def link_order(run: Walk, device: int, pp: int) -> tuple[Transfer, ...]:
    """The transfers that cross between ``device`` and another device, in the walk's order of
    sends: the order in which the distributed runtime posts them on that device (``runtime.p2p``)."""
    mine = [t for t in run.transfers if device in (t.src % pp, t.dst % pp) and t.src % pp != t.dst % pp]
    return tuple(sorted(mine, key=run.transfers.__getitem__))


def _what(transfer: Transfer) -> str:
    return f"{'activation' if transfer.kind == 'F' else 'gradient'} of {transfer.kind}{transfer.group}"


def _where(vstage: int, pp: int) -> str:
    return f"stage {vstage % pp}" + (f" chunk {vstage // pp}" if vstage >= pp else "")


GRID_CONTEXT = 3
"""Rows of the grid shown before the first and after the last waiting step."""


def deadlock_message(order: Sequence[Sequence[Action]], position: Sequence[int], waits: Mapping[int, str], *,
                     where: str) -> str:
    """The deadlock as text: one line naming each waiting stage (``waits[d]``: what stage d waits
    for), then a step × stage grid of the orders (``+`` ran, ``>`` waits here; rows far from the
    waits are left out). ``position[d]``: how many of stage d's actions ran."""
    summary = "; ".join(f"stage {d} at {order[d][position[d]]} waits for {what}" for d, what in waits.items())
    first = max(0, min(position[d] for d in waits) - GRID_CONTEXT)
    last = min(max(len(a) for a in order), max(position[d] for d in waits) + GRID_CONTEXT + 1)
    header = ["step"] + [f"stage {d}" for d in range(len(order))]
    rows = []
    for k in range(first, last):
        cells = [str(k)]
        for d, actions in enumerate(order):
            mark = "+" if k < position[d] else ">" if k == position[d] and d in waits else " "
            cells.append(f"{mark} {actions[k]}" if k < len(actions) else "")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    skipped = [f"  (steps 0..{first - 1} ran on every stage)"] if first else []
    return (f"{where}: the order deadlocks: {summary}\n  (+ ran, > waits)\n" + "\n".join(
        ["  " + line for line in lines[:1]] + skipped + ["  " + line for line in lines[1:]]))
