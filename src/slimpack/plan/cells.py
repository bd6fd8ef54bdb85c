"""How a pipeline's forward and backward groups decompose into cells.

The slices of forward group g that belong to backward group b form the *cell* (g, b): the unit
that gets its own autograd graph on a stage (see ``runtime.executor``), and so its own GEMMs,
attention call and per-call overheads. Inside a cell, consecutive slices of one sample form a
*run*, one attention segment ([a, b) and [b, c) together are [a, c)).
``pipeline_cells`` is the decomposition (the simulator charges one call per cell from it);
``GroupLayout`` also checks that the groups are well formed (both partitions hold the same slices;
each sample's slices tile [0, length)) and maps rows between a cell and its groups' packed layouts.

Context parallelism (``shard=(cp_rank, cp)``): every slice is cut into 2·cp near-equal chunks and cp
rank i holds chunks i and 2·cp−1−i (zigzag: a causal slice's early chunks have few keys, its late
ones many, so each rank gets one of each; an unsliced document is thus sharded per document as in
WLB-LLM and Megatron's CP). Rows are then this rank's tokens only, in the same order as without
sharding; a cell's *pieces* are its contiguous local position ranges, one attention segment each.
Ownership depends on the slice alone, so forward groups, backward groups and cells agree on it.
Must not import torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter

from slimpack.plan.types import Run, Slice, runs


def fmt_slice(s: Slice) -> str:
    return f"({s.sample_id}, {s.start}, {s.end})"


def zigzag(start: int, end: int, shard: tuple[int, int]) -> list[tuple[int, int]]:
    """The position ranges of [start, end) that cp rank ``shard[0]`` of ``shard[1]`` holds (non-empty)."""
    rank, size = shard
    if size == 1:
        return [(start, end)] if end > start else []
    n, parts = end - start, 2 * size
    bounds = [start + n * j // parts for j in range(parts + 1)]
    chunks = [(bounds[rank], bounds[rank + 1]), (bounds[parts - 1 - rank], bounds[parts - rank])]
    return [(a, b) for a, b in chunks if b > a]


@dataclass(frozen=True, slots=True)
class Piece:
    """Contiguous positions [start, end) of run ``run`` of a cell that this rank holds."""

    run: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Cell:
    key: tuple[int, int]
    """(forward group, backward group)."""
    slices: tuple[Slice, ...]
    runs: tuple[Run, ...]


def pipeline_cells(forward: Sequence[Sequence[Slice]], backward: Sequence[Sequence[Slice]], *,
                   name: str = "pipeline") -> list[list[Cell]]:
    """Per forward group, its cells in the order of their first slice in the group. Raises
    ``ValueError`` for a cell no order can run (see ``cell_runs``)."""
    # slice -> its backward group, and each forward group's slices' backward groups, built in C
    backward_of = dict(zip(chain.from_iterable(backward),
                           chain.from_iterable(repeat(b, len(group)) for b, group in enumerate(backward)), strict=True))
    cells = []
    for g, group in enumerate(forward):
        targets = list(map(backward_of.__getitem__, group))
        if targets and targets.count(targets[0]) == len(targets):  # the whole group in one backward group
            slices = tuple(group)
            cells.append([Cell((g, targets[0]), slices, cell_runs(g, targets[0], slices, name=name))])
            continue
        members: dict[int, list[Slice]] = {}
        for s, b in zip(group, targets, strict=True):
            members.setdefault(b, []).append(s)
        cells.append([Cell((g, b), tuple(slices), cell_runs(g, b, slices, name=name)) for b, slices in members.items()])
    return cells


def cell_runs(g: int, b: int, slices: Sequence[Slice], *, name: str = "pipeline") -> tuple[Run, ...]:
    """The attention segments of cell (g, b): each sample's slices in the cell must be consecutive
    (the slice between two of them would have to run backward both before and after them)."""
    if len(set(map(itemgetter(0), slices))) == len(slices):
        return tuple(slices)  # one slice per sample: each is its own run (the common case, decided fast)
    per_sample: dict[int, list[Slice]] = {}
    for s in slices:
        per_sample.setdefault(s.sample_id, []).append(s)
    out: list[Run] = []
    for items in per_sample.values():
        items.sort(key=lambda s: s.start)
        for s, t in zip(items, items[1:], strict=False):
            if s.end != t.start:
                raise ValueError(
                    f"{name}: slices {fmt_slice(s)} and {fmt_slice(t)} share forward group {g} and "
                    f"backward group {b} but a slice between them does not; no order can run them")
        out.extend(runs(items))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CellSpec:
    key: tuple[int, int]
    """(forward group, backward group)."""
    slices: tuple[Slice, ...]
    runs: tuple[Run, ...]
    """The cell's rows are its runs' tokens (this rank's, under context parallelism), run after run."""
    pieces: tuple[Piece, ...]
    """This rank's contiguous parts of the runs, in row order (the runs themselves without sharding)."""
    fg_rows: list[int]
    """For each row of the cell, its row in the forward group's layout."""
    bg_rows: list[int]
    """For each row of the cell, its row in the backward group's layout."""
    fg_identity: bool
    bg_identity: bool


class GroupLayout:
    """The groups of one pipeline, indexed: which group and row each slice has, and the cells."""

    def __init__(self, forward: Sequence[Sequence[Slice]], backward: Sequence[Sequence[Slice]],
                 sample_lengths: Mapping[int, int], *, name: str = "stage", shard: tuple[int, int] = (0, 1)) -> None:
        self.name = name
        self.shard = shard
        self.forward = tuple(tuple(Slice(*s) for s in g) for g in forward)
        self.backward = tuple(tuple(Slice(*s) for s in g) for g in backward)
        self.lengths = dict(sample_lengths)
        self.fg_of, self.fg_row = self._index(self.forward, "forward")
        self.bg_of, self.bg_row = self._index(self.backward, "backward")
        if set(self.fg_of) != set(self.bg_of):
            extra = sorted(set(self.fg_of) ^ set(self.bg_of))[:3]
            raise ValueError(f"{name}: forward and backward groups do not hold the same slices, e.g. "
                             f"{', '.join(map(fmt_slice, extra))}")
        self.by_sample = self._check_tiling()
        """Each sample's slices in position order."""
        self.cells = {g: [self._cell(cell) for cell in cells]
                      for g, cells in enumerate(pipeline_cells(self.forward, self.backward, name=name))}
        """Cells per forward group, in the order of their first slice in the group."""

    def owned(self, s: Slice, shard: tuple[int, int] | None = None) -> list[tuple[int, int]]:
        """Positions of slice ``s`` held by ``shard`` (default: this layout's)."""
        return zigzag(s.start, s.end, shard or self.shard)

    def local_tokens(self, s: Slice) -> int:
        return sum(b - a for a, b in self.owned(s))

    def group_tokens(self, kind: str, group: int) -> int:
        """Rows of a group on this rank."""
        groups = self.forward if kind == "F" else self.backward
        return sum(self.local_tokens(s) for s in groups[group])

    def gather_order(self, spec: CellSpec) -> tuple[list[int], int]:
        """How the cp ranks' rows of a cell, each padded to the longest and concatenated rank after
        rank, map back to the cell's full runs: (for each full row, its index in the concatenation;
        padded rows per rank)."""
        size = self.shard[1]
        per_rank = []
        for rank in range(size):
            where: dict[tuple[int, int], int] = {}
            for i, run in enumerate(spec.runs):
                for s in self.by_sample[run.sample_id]:
                    if run.start <= s.start < run.end:
                        for a, b in self.owned(s, (rank, size)):
                            for p in range(a, b):
                                where[(i, p)] = len(where)
            per_rank.append(where)
        width = max(len(w) for w in per_rank)
        owner = {key: rank * width + row for rank, where in enumerate(per_rank) for key, row in where.items()}
        return [owner[(i, p)] for i, run in enumerate(spec.runs) for p in range(run.start, run.end)], width

    def cell(self, key: tuple[int, int]) -> CellSpec:
        return next(c for c in self.cells[key[0]] if c.key == key)

    def waves(self, keys: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        """Cells of one backward group in rounds: a cell waits for the cells holding later slices of
        its samples (they hand it dK/dV)."""
        specs = {key: self.cell(key) for key in keys}
        waits = {key: {other for other in keys if other != key and any(
            t.sample_id == s.sample_id and t.start > s.start
            for s in specs[key].slices for t in specs[other].slices)} for key in keys}
        waves: list[list[tuple[int, int]]] = []
        done: set[tuple[int, int]] = set()
        while len(done) < len(keys):
            ready = [key for key in keys if key not in done and waits[key] <= done]
            assert ready, f"cyclic cell dependencies in {keys}"  # impossible once cells are checked
            waves.append(ready)
            done.update(ready)
        return waves

    def _index(self, groups: tuple[tuple[Slice, ...], ...], what: str) -> tuple[dict[Slice, int], dict[Slice, int]]:
        group_of: dict[Slice, int] = {}
        row_of: dict[Slice, int] = {}
        for g, group in enumerate(groups):
            row = 0
            for s in group:
                if s.sample_id not in self.lengths:
                    raise ValueError(f"{self.name}: {what} group {g} has slice {fmt_slice(s)} of unknown sample")
                if not 0 <= s.start < s.end <= self.lengths[s.sample_id]:
                    raise ValueError(f"{self.name}: {what} group {g} has slice {fmt_slice(s)} outside sample "
                                     f"{s.sample_id} of length {self.lengths[s.sample_id]}")
                if s in group_of:
                    raise ValueError(f"{self.name}: slice {fmt_slice(s)} is in {what} groups {group_of[s]} and {g}")
                group_of[s], row_of[s] = g, row
                row += self.local_tokens(s)
        return group_of, row_of

    def _check_tiling(self) -> dict[int, list[Slice]]:
        by_sample: dict[int, list[Slice]] = {}
        for s in self.fg_of:
            by_sample.setdefault(s.sample_id, []).append(s)
        for sid, slices in by_sample.items():
            slices.sort(key=lambda s: s.start)
            at = 0
            for s in slices:
                if s.start != at:
                    raise ValueError(f"{self.name}: the slices of sample {sid} do not tile [0, "
                                     f"{self.lengths[sid]}): {'gap' if s.start > at else 'overlap'} at {at}")
                at = s.end
            if at != self.lengths[sid]:
                raise ValueError(f"{self.name}: the slices of sample {sid} end at {at}, not at its length "
                                 f"{self.lengths[sid]}")
        return by_sample

    def _cell(self, cell: Cell) -> CellSpec:
        (g, b), slices, runs = cell.key, cell.slices, cell.runs
        per_sample: dict[int, list[Slice]] = {}
        for s in slices:
            per_sample.setdefault(s.sample_id, []).append(s)
        for items in per_sample.values():
            items.sort(key=lambda s: s.start)
        fg_rows: list[int] = []
        bg_rows: list[int] = []
        pieces: list[Piece] = []
        for i, run in enumerate(runs):
            for s in per_sample[run.sample_id]:
                n = self.local_tokens(s)
                fg_rows.extend(range(self.fg_row[s], self.fg_row[s] + n))
                bg_rows.extend(range(self.bg_row[s], self.bg_row[s] + n))
                for a, e in self.owned(s):
                    if pieces and pieces[-1].run == i and pieces[-1].end == a:
                        pieces[-1] = Piece(i, pieces[-1].start, e)
                    else:
                        pieces.append(Piece(i, a, e))
        return CellSpec(key=(g, b), slices=slices, runs=tuple(runs), pieces=tuple(pieces), fg_rows=fg_rows, bg_rows=bg_rows,
                        fg_identity=fg_rows == list(range(self.group_tokens("F", g))),
                        bg_identity=bg_rows == list(range(self.group_tokens("B", b))))
