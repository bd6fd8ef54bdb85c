"""Uneven pipeline stages: the layer split that balances each stage's work.

The first pipeline stage also embeds the tokens and the last one runs the final norm, the LM head
and the loss. With a large vocabulary (Llama 3: 128K, Qwen2.5: 152K) the head costs more than a
layer, so an even layer split leaves the last stage the pipeline's bottleneck whatever the
grouping. ``balanced_stage_layers`` gives each stage the layer count that minimises the largest
stage's forward + backward time for a token mix, from the one cost model.
Must not import torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from slimpack.config import Config
from slimpack.cost.model import CostModel
from slimpack.errors import UserError


@dataclasses.dataclass(frozen=True, slots=True)
class StageWork:
    """Forward + backward seconds of one layer and of each stage's extras for a token mix."""

    layer_s: float
    embedding_s: float
    head_s: float

    def stage_times(self, stage_layers: Sequence[int], *, pp: int) -> list[float]:
        """Seconds per pipeline stage for a per-chunk split (chunk v runs on stage v % pp)."""
        times = [0.0] * pp
        for chunk, layers in enumerate(stage_layers):
            times[chunk % pp] += layers * self.layer_s
        times[0] += self.embedding_s
        times[-1] += self.head_s
        return times

    def balanced_split(self, num_layers: int, *, pp: int, virtual_stages: int) -> tuple[int, ...]:
        """Layers per chunk that minimise the slowest of ``pp`` stages (``balanced_stage_layers``)."""
        extras = [0.0] * pp
        extras[0] += self.embedding_s
        extras[-1] += self.head_s
        per_stage = _min_max_split(num_layers, extras, self.layer_s, minimum=virtual_stages)
        return _chunks_of_stages(per_stage, virtual_stages)


def stage_work(config: Config, lengths: Sequence[int] | None = None) -> StageWork:
    """The work of ``lengths`` (default: one sample of the context length), each a whole document,
    as one group: the split only needs the ratio of a layer's time to the extras'."""
    # a single-stage layout: valid for any layer count, and layer/extra times do not depend on pp
    probe = dataclasses.replace(config, parallel=dataclasses.replace(
        config.parallel, pp=1, virtual_stages=1, stage_layers=()))
    cost = CostModel(probe)
    tokens = np.asarray(lengths if lengths is not None else [config.train.max_context], dtype=np.int64)
    prefix = np.zeros(len(tokens))
    total = float(tokens.sum())
    layer = sum(cost.layer_time(tokens, prefix, backward=b) for b in (False, True))
    head = sum(cost.head_time(total, cost.cp, b) for b in (False, True))
    embedding = 2 * cost.embedding_time(total, cost.cp)
    return StageWork(layer_s=layer, embedding_s=embedding, head_s=head)


def balanced_stage_layers(config: Config, lengths: Sequence[int] | None = None, *, pp: int | None = None,
                          virtual_stages: int | None = None) -> tuple[int, ...]:
    """Layers per model chunk (``ParallelConfig.stage_layers`` order) that minimise the slowest
    stage's time for ``lengths`` (see ``stage_work``) on ``pp`` stages of ``virtual_stages`` chunks
    (default: the config's own; given, the config's pipeline is not read, so a layout whose layers do
    not divide evenly can be split from a config without a pipeline); each chunk keeps at least one
    layer.

    Among the splits with that smallest maximum, layers are taken off the most loaded stage first
    and, at equal load, off the earliest stage: early stages hold the most forwards in flight under
    1F1B, so they are the ones whose activation memory runs out first.
    """
    return stage_work(config, lengths).balanced_split(
        config.model.num_layers, pp=pp or config.parallel.pp,
        virtual_stages=virtual_stages or config.parallel.virtual_stages)


def split_gain(config: Config, lengths: Sequence[int] | None = None) -> tuple[tuple[int, ...], float]:
    """The balanced split for ``lengths`` and its slowest stage's time over that of the config's own
    split (1.0 where the config's split is already balanced)."""
    par = config.parallel
    work = stage_work(config, lengths)  # once: the split and both stage times read it
    balanced = work.balanced_split(config.model.num_layers, pp=par.pp, virtual_stages=par.virtual_stages)
    own = max(work.stage_times(par.chunk_layers(config.model.num_layers), pp=par.pp))
    return balanced, max(work.stage_times(balanced, pp=par.pp)) / own


def _min_max_split(num_layers: int, extras: Sequence[float], layer_s: float, *, minimum: int) -> list[int]:
    """Integer layers per stage, summing to ``num_layers``, each >= ``minimum``, minimising the
    largest ``layers·layer_s + extra``: the smallest target whose per-stage caps hold every layer."""
    num = len(extras)
    if num_layers < minimum * num:
        raise UserError(f"{num_layers} layers cannot give {num} pipeline stages {minimum} layer(s) each")
    targets = sorted({k * layer_s + e for e in extras for k in range(minimum, num_layers + 1)})
    for target in targets:
        # the 1e-9 relative slack keeps a cap from losing a layer to floating-point roundoff
        caps = [int((target - e) / layer_s * (1 + 1e-9)) for e in extras]
        if min(caps) >= minimum and sum(caps) >= num_layers:
            break
    layers = caps
    for _ in range(sum(layers) - num_layers):
        loads = [(n * layer_s + e, -s) for s, (n, e) in enumerate(zip(layers, extras, strict=True)) if n > minimum]
        _, neg_stage = max(loads)
        layers[-neg_stage] -= 1
    return layers


def _chunks_of_stages(per_stage: Sequence[int], virtual_stages: int) -> tuple[int, ...]:
    """Spread each stage's layers over its chunks as evenly as possible (chunk c of stage s is entry
    c·pp + s); the remainder goes to its earliest chunks."""
    pp = len(per_stage)
    chunks = [0] * (pp * virtual_stages)
    for stage, layers in enumerate(per_stage):
        base, extra = divmod(layers, virtual_stages)
        for c in range(virtual_stages):
            chunks[c * pp + stage] = base + (1 if c < extra else 0)
    return tuple(chunks)
