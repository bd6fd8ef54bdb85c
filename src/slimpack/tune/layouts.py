"""The layouts a GPU budget allows: tp, pp (with virtual stages and stage splits), cp, dp and
recomputation, each as a ``Config``; and the reasons the others cannot work, counted.
Must not import torch.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from slimpack.config import Config, ParallelConfig
from slimpack.cost.stages import balanced_stage_layers
from slimpack.errors import UserError

RECOMPUTE = ("none", "selective", "full")
VIRTUAL_STAGES = (1, 2)
"""Interleaving beyond 2 chunks per stage only helps with many micro-batches per pipeline, which
long-context batches do not have; the search stays at 1 and 2."""


@dataclass(frozen=True, slots=True)
class Layout:
    """One point of the search: a parallel layout and a recomputation policy."""

    tp: int
    pp: int
    cp: int
    dp: int
    vpp: int
    recompute: str
    stage_layers: tuple[int, ...] = ()
    """Per-chunk layers when uneven; empty for an even split."""
    micro_batch_tokens: int | None = None
    """A baseline's micro-batch token cap, where the search tries one above the base's."""

    def label(self) -> str:
        split = f" [{'/'.join(map(str, self.stage_layers))}]" if self.stage_layers else ""
        vpp = f" vpp{self.vpp}" if self.vpp > 1 else ""
        cap = f" mb{self.micro_batch_tokens // 1024}K" if self.micro_batch_tokens else ""
        return f"tp{self.tp} pp{self.pp}{vpp} cp{self.cp} dp{self.dp} rc-{self.recompute}{split}{cap}"

    def apply(self, base: Config) -> Config:
        """``base`` with this layout (raises ``UserError`` when the layout cannot hold the model)."""
        parallel = dataclasses.replace(base.parallel, tp=self.tp, pp=self.pp, cp=self.cp, dp=self.dp,
                                       virtual_stages=self.vpp, stage_layers=self.stage_layers)
        train = dataclasses.replace(base.train, recompute=self.recompute,
                                    micro_batch_tokens=self.micro_batch_tokens or base.train.micro_batch_tokens)
        return dataclasses.replace(base, parallel=parallel, train=train)


def powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(limit.bit_length()) if 2**k <= limit]


def layouts(base: Config, num_gpus: int, lengths: Sequence[int], skipped: Counter[str]) -> Iterator[Layout]:
    """Every layout of ``num_gpus`` GPUs that can hold ``base.model``; each one that cannot is
    counted in ``skipped`` under its reason. ``lengths`` (a batch's) weigh the uneven split."""
    model = base.model
    for tp in powers_of_two(base.cluster.gpus_per_node):
        if model.num_heads % tp or model.num_kv_heads % tp or model.ffn_hidden % tp:
            skipped["tp does not divide the heads, KV heads or MLP width"] += 1
            continue
        for pp in powers_of_two(num_gpus // tp):
            for cp in powers_of_two(num_gpus // (tp * pp)):
                if num_gpus % (tp * pp * cp):
                    skipped["tp·pp·cp does not divide the GPUs"] += 1
                    continue
                dp = num_gpus // (tp * pp * cp)
                for vpp in VIRTUAL_STAGES if pp > 1 else (1,):
                    yield from _splits(base, Layout(tp, pp, cp, dp, vpp, "none"), lengths, skipped)


def _splits(base: Config, layout: Layout, lengths: Sequence[int], skipped: Counter[str]) -> Iterator[Layout]:
    """The even split (when the layers divide) and the balanced uneven one, each recomputation."""
    chunks = layout.pp * layout.vpp
    if base.model.num_layers < chunks:
        skipped["fewer layers than pipeline chunks"] += len(RECOMPUTE)
        return
    flat = ParallelConfig(tp=layout.tp, cp=layout.cp, dp=layout.dp)  # any layer count divides over one stage
    try:
        balanced = balanced_stage_layers(dataclasses.replace(base, parallel=flat), lengths, pp=layout.pp,
                                         virtual_stages=layout.vpp)
    except UserError as exc:
        skipped[str(exc)] += len(RECOMPUTE)
        return
    layers = base.model.num_layers
    if layers % chunks:
        splits = [balanced]
    else:
        even = (layers // chunks,) * chunks
        splits = [()] if balanced == even else [(), balanced]
    for split in splits:
        for recompute in RECOMPUTE:
            yield dataclasses.replace(layout, recompute=recompute, stage_layers=split)
