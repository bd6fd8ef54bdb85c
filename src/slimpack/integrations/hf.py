"""Padding-free batches for Hugging Face Transformers / TRL from slimpack plans (imports torch).

Each data-parallel rank gets the micro-batches its replica runs in a whole-sample plan, one packed
row per micro-batch, in the format of transformers' ``DataCollatorWithFlattening`` (with
``return_flash_attn_kwargs=True``; read from transformers 5.23):

- ``input_ids``, ``labels``, ``position_ids``: int64 ``[1, T]``; the samples one after the other,
  ``position_ids`` restarting at 0 for every sample, ``labels`` the tokens with ``-100`` on each
  sample's first token (so no token predicts across a sample boundary; the model shifts labels);
- ``cu_seq_lens_q`` = ``cu_seq_lens_k``: int32 cumulative sample lengths ``[0, l0, l0 + l1, ...]``,
  ``max_length_q`` = ``max_length_k``: the longest sample (Python int).

Models running FlashAttention read the ``cu_seq_lens``; the others (sdpa, eager) find the sample
boundaries in ``position_ids``, as transformers' masking utilities do for packed rows, but only when
no KV cache is built: train with ``model.config.use_cache = False`` (with a cache, transformers 5.23
silently lets the packed samples attend to each other; the equality test would catch it).

Wiring (one DataLoader per rank; every rank computes the same plans, the MILP off)::

    loader = plan_data_loader(token_rows, config, rank=rank, num_steps=100)
    for step, count in enumerate(loader.batch_sampler.micro_batches_per_step):
        ...  # `count` micro-batches, then optimizer.step(); every rank runs the same count

Every rank runs the same number of micro-batches per step, the most any replica's plan holds: a
rank whose replica holds fewer micro-batches gets *padding micro-batches* at the end of the
step, each a one-token row (token :data:`PADDING_TOKEN`, label ``-100``, ``position_ids`` 0,
``cu_seq_lens`` ``[0, 1]``, ``max_length`` 1) that predicts nothing, so that DDP's gradient
all-reduce and gradient accumulation see the same forward/backward calls on every rank.

The loss must be normalised by the global batch's loss tokens (``loss_tokens(step)``): a sum of
token losses divided by that count, not each micro-batch's mean, to equal unpacked training
(DESIGN.md §3); a padding row then adds exactly 0 to the loss and the gradients. With a Trainer,
that is what ``num_items_in_batch`` with ``average_tokens_across_devices`` does. A per-micro-batch
mean (``reduction="mean"``, transformers' causal-LM loss without ``num_items_in_batch``) divides by
the row's zero loss tokens: a padding row's loss and every gradient become NaN.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Sampler
from torch.utils.data import Dataset as TorchDataset

from slimpack.config import Config
from slimpack.data import Dataset
from slimpack.errors import UserError
from slimpack.integrations.wholesample import rank_micro_batches, whole_sample_config
from slimpack.plan.types import Plan

IGNORE_INDEX = -100
"""Label of a token that predicts nothing (PyTorch's cross-entropy default ``ignore_index``)."""
PADDING_TOKEN = 0
"""Token id of a padding micro-batch's one-token row: any valid id does, its label is ignored."""
FRAMEWORK = "Hugging Face data parallelism"

SampleKey = tuple[int, int, int]
"""(row of the token dataset, first token, end token): one sample, a whole row, a chunk or a piece of it."""


class _Source(Protocol):
    doc_index: int

    def token_range(self, max_context: int) -> tuple[int, int]: ...


class _PlannedStep(Protocol):
    plan: Plan
    sources: Any  # Mapping[int, _Source]: plan sample id -> where its tokens come from


def packed_batch(features: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``collate_fn``: samples (dicts holding ``input_ids``) -> one packed row (module doc). No
    samples (a padding micro-batch) -> the padding row: one sample of one token, :data:`PADDING_TOKEN`,
    whose label is ``-100`` as every sample's first token's is."""
    if not features:
        features = [{"input_ids": [PADDING_TOKEN]}]
    tokens = [torch.as_tensor(f["input_ids"], dtype=torch.long).reshape(-1) for f in features]
    lengths = torch.tensor([0] + [t.numel() for t in tokens])
    input_ids = torch.cat(tokens)
    labels = input_ids.clone()
    starts = torch.cumsum(lengths, 0)[:-1]
    labels[starts] = IGNORE_INDEX
    position_ids = torch.cat([torch.arange(t.numel()) for t in tokens])
    cu_seq_lens = torch.cumsum(lengths, 0).to(torch.int32)
    longest = int(lengths.max())
    return {"input_ids": input_ids[None], "labels": labels[None], "position_ids": position_ids[None],
            "cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens,
            "max_length_q": longest, "max_length_k": longest}


class PlanBatchSampler(Sampler[list[SampleKey]]):
    """One rank's micro-batches over a stream of plans: each item is a list of :data:`SampleKey`.

    ``steps`` yields objects with ``plan`` and ``sources`` (``slimpack.strategies.stream.PlannedStep``:
    plan sample id -> the sampler's sample, with its document and ``token_range``). Plans must be
    whole-sample, or are lowered to that form with ``lower=True``; every rank gets the same number
    of micro-batches per step (``micro_batches_per_step``), padding micro-batches (empty lists,
    which :func:`packed_batch` turns into the padding row) at the end of a step where its replica
    holds fewer micro-batches (module doc).
    """

    def __init__(self, steps: Iterable[_PlannedStep], *, rank: int, max_context: int, lower: bool = False) -> None:
        self.rank = rank
        self._steps: list[list[list[SampleKey]]] = []
        self._loss_tokens: list[int] = []
        for step in steps:
            per_rank = rank_micro_batches(step.plan, lower=lower, framework=FRAMEWORK)
            if not 0 <= rank < len(per_rank):
                raise UserError(f"rank {rank} is outside the plan's {len(per_rank)} data-parallel replicas")
            keys = {sid: _key(step.sources[sid], max_context) for batches in per_rank for mb in batches for sid in mb}
            self._steps.append([[keys[sid] for sid in mb] for mb in per_rank[rank]])
            # each sample's first token predicts nothing: (length - 1) loss tokens per sample
            self._loss_tokens.append(sum(end - start - 1 for start, end in
                                         ((k[1], k[2]) for k in keys.values())))

    @property
    def micro_batches_per_step(self) -> list[int]:
        return [len(step) for step in self._steps]

    def loss_tokens(self, step: int) -> int:
        """Tokens with a label in the whole global batch of ``step`` (over every rank)."""
        return self._loss_tokens[step]

    def __iter__(self) -> Iterator[list[SampleKey]]:
        for step in self._steps:
            yield from (list(mb) for mb in step)

    def __len__(self) -> int:
        return sum(self.micro_batches_per_step)


def _key(source: _Source, max_context: int) -> SampleKey:
    return (source.doc_index, *source.token_range(max_context))


class TokenRows(TorchDataset):
    """The token dataset seen through :data:`SampleKey`: ``rows[i][column]`` (or ``rows[i]`` when
    ``column`` is None) holds row i's token ids; an item is ``{"input_ids": tokens[start:end]}``."""

    def __init__(self, rows: Sequence[Any], column: str | None = "input_ids") -> None:
        self.rows = rows
        self.column = column

    def tokens(self, index: int) -> Sequence[int]:
        row = self.rows[index]
        return row if self.column is None else row[self.column]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: SampleKey) -> dict[str, Any]:
        index, start, end = key
        return {"input_ids": torch.as_tensor(self.tokens(index)[start:end], dtype=torch.long)}


def plan_data_loader(rows: Sequence[Any], config: Config, *, rank: int, num_steps: int,
                     strategy: str = "slimpack", column: str | None = "input_ids",
                     shuffle: bool = False) -> DataLoader:
    """A DataLoader of this rank's packed micro-batches for ``num_steps`` global batches of the
    token rows, planned by ``strategy`` under ``config`` (whose ``dp`` is the number of ranks) in
    whole-sample form (:func:`~slimpack.integrations.wholesample.whole_sample_config`).
    Its ``batch_sampler`` is the :class:`PlanBatchSampler` (micro-batches per step, loss tokens)."""
    from slimpack.runtime.loader import PlanningLoader  # plans only; no torch inside

    tokens = TokenRows(rows, column)
    lengths = [len(tokens.tokens(i)) for i in range(len(tokens))]
    empty = next((i for i, n in enumerate(lengths) if n == 0), None)
    if empty is not None:
        raise UserError(f"row {empty} has no tokens")
    stream = PlanningLoader(Dataset(name="token rows", lengths=lengths, source="plan_data_loader"),
                            whole_sample_config(config), strategy, shuffle=shuffle, ahead=False)
    steps = [next(stream) for _ in range(num_steps)]
    sampler = PlanBatchSampler(steps, rank=rank, max_context=config.train.max_context)
    return DataLoader(tokens, batch_sampler=sampler, collate_fn=packed_batch)


__all__ = ["IGNORE_INDEX", "PADDING_TOKEN", "PlanBatchSampler", "SampleKey", "TokenRows", "packed_batch", "plan_data_loader"]
