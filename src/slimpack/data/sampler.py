"""Global batches drawn from a dataset under a token budget, documents cut at the context length.

Semantics (every planner and benchmark sees batches made this way):

- **Order.** Epoch ``e`` visits every document once, in data order, or (``shuffle=True``) in a
  permutation drawn from ``numpy.random.default_rng([seed, e])``: fixed per (seed, epoch), and
  different from one epoch to the next. Epochs follow each other without a gap: the batch that
  reaches the end of epoch ``e`` goes on with the start of epoch ``e + 1``, so every batch obeys
  the rule below and no data is left over at an epoch's end.
- **Chunking.** A document longer than ``max_context`` becomes ``ceil(length / max_context)``
  samples: chunks of ``max_context`` tokens, the last one the remainder, kept consecutive and in
  order. With ``drop_long=True`` such documents are skipped instead; every skip is counted (per
  epoch on the sampler, per batch on each :class:`Batch`), never silent.
- **Budget.** Samples are taken in stream order; a batch is full when adding the next sample would
  exceed ``global_batch_tokens``; that sample then starts the next batch. Since
  ``max_context <= global_batch_tokens`` (checked), every sample fits in an empty batch, so every
  batch holds at least one sample and never more than the budget.
- **Identity.** Inside a batch, samples have ids ``0..n-1`` in stream order; each carries the index
  of its source document in the dataset (``doc_index``), its chunk number and its epoch.
- **Steps.** ``batch_at(step)`` is a pure function of (dataset, config, step). Batch boundaries
  are found with one binary search per batch over cumulative sums (numpy), remembered as steps
  are reached, so the first call for step ~10^4 costs milliseconds to a second on 1M documents.

Must not import torch.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from slimpack.config.base import ConfigBase, require
from slimpack.config.train import TrainConfig
from slimpack.data.dataset import Dataset
from slimpack.data.stats import context_cut
from slimpack.errors import UserError


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplerConfig(ConfigBase):
    global_batch_tokens: int = 4 * 2**20
    """Token budget of one global batch; a batch never exceeds it."""
    max_context: int = 65536
    """Longest sample; longer documents are chunked (or dropped with ``drop_long``)."""
    shuffle: bool = False
    """Visit documents in a seeded random order, a new permutation each epoch."""
    seed: int = 0
    """Seed of the per-epoch permutation (ignored without ``shuffle``)."""
    drop_long: bool = False
    """Skip documents longer than ``max_context`` instead of chunking them (counted)."""

    def __post_init__(self) -> None:
        for name in ("global_batch_tokens", "max_context"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                    f"{name} must be a positive integer, got {value!r}")
        require(self.max_context <= self.global_batch_tokens,
                f"max_context ({self.max_context}) must be <= global_batch_tokens "
                f"({self.global_batch_tokens}): a sample must fit in a batch")
        require(isinstance(self.seed, int) and self.seed >= 0,
                f"seed must be a non-negative integer, got {self.seed!r}")

    @classmethod
    def from_train(cls, train: TrainConfig, *, shuffle: bool = False,
                   drop_long: bool = False) -> SamplerConfig:
        """Budget, context and seed of a training config."""
        return cls(global_batch_tokens=train.global_batch_tokens, max_context=train.max_context,
                   shuffle=shuffle, seed=train.seed, drop_long=drop_long)


@dataclass(frozen=True, slots=True, kw_only=True)
class DocumentChunk:
    id: int
    """Position in the batch, 0..n-1 in stream order."""
    length: int
    """Tokens in this sample (a whole document or one chunk of it)."""
    doc_index: int
    """Index of the source document in the dataset."""
    chunk: int
    """Which chunk of that document (0 for a document that was not cut)."""
    epoch: int
    """Epoch of the stream this sample was taken from."""
    offset: int = 0
    """Its first token within its chunk: 0, or where a fixed-length sequence boundary cut the chunk
    (``TrainConfig.cut_documents``; the stream then makes one such sample per piece)."""

    def token_range(self, max_context: int) -> tuple[int, int]:
        """Its tokens' [start, end) within its document: every reader of a sample's text uses this."""
        start = self.chunk * max_context + self.offset
        return start, start + self.length


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    step: int
    """Index of the batch in the stream (the optimizer step)."""
    samples: tuple[DocumentChunk, ...]
    """The batch's samples, ids 0..n-1."""
    num_dropped_docs: int = 0
    """Documents skipped (``drop_long``) in the stream between the previous batch's last sample
    and this batch's last sample; summed over all batches, every skip is counted once."""
    num_dropped_tokens: int = 0
    """Their tokens."""

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(sample.length for sample in self.samples)

    @property
    def num_tokens(self) -> int:
        return sum(sample.length for sample in self.samples)


@dataclass(frozen=True, slots=True)
class _Epoch:
    """One epoch's stream of samples as arrays (index k = k-th sample of the epoch)."""

    length: np.ndarray
    doc_index: np.ndarray
    chunk: np.ndarray
    cum: np.ndarray
    """cum[k] = tokens of samples [0, k); length n + 1."""
    docs_before: np.ndarray
    """docs_before[k] = documents of the visiting order consumed once sample k-1 is taken."""
    dropped_docs: np.ndarray
    """dropped_docs[d] = skipped documents among the first d of the visiting order."""
    dropped_tokens: np.ndarray


_EPOCH_CACHE = 2
"""Epochs kept for every sampler of the process: batches straddle at most a few epochs, and the
arrays of 1M documents are ~50 MB each."""
_epochs: OrderedDict[tuple, tuple[np.ndarray, _Epoch]] = OrderedDict()
"""Built epochs by (the dataset's lengths, settings, epoch), shared by samplers: a comparison or a
``tune`` search makes a sampler per strategy and layout over the same data and settings, and
building an epoch of 1M documents took ~0.13 s, a third of a baseline's one-step trial. Each entry
holds its lengths array, so the ``id`` in its key cannot be reused while it is cached."""


MAX_EPOCH_SAMPLES = 2**26
"""Most samples an epoch may hold: an epoch is built as arrays of ~56 bytes per sample at its peak
(wikipedia cut at 16 tokens: 63.8M samples, 3.4 GiB), so this bounds it near 3.5 GiB. A context of a
few tokens (a missing K or M) would otherwise cut wikipedia's 1.0G tokens into as many samples and
run out of memory."""


MAX_BATCH_SAMPLES = 2**20
"""Most samples one global batch may hold. Planning time grows with them: 2048 GPUs at 64K tokens per
GPU on wikipedia make 133,260 samples, while a context of 1 token on cpython (7.9M samples per epoch,
under ``MAX_EPOCH_SAMPLES``) made 4M-sample batches whose planning had not ended after 10 minutes."""


_BATCH_CACHE = 4
"""Batches kept for every sampler of the process, by (the dataset's lengths, settings, step and the
stream positions it spans): a ``tune`` search makes a sampler per strategy and layout and screens
each on the same first step, and making a 16K-sample batch's chunks was ~5% of a baseline's one-step
trial at 256 GPUs. Few are kept: a 2048-GPU batch is ~20 MB of objects. Batches are immutable; each
entry holds its lengths array, as ``_epochs`` does."""
_batches: OrderedDict[tuple, tuple[np.ndarray, Batch]] = OrderedDict()


class GlobalBatchSampler:
    """Batches of ``dataset`` under ``config`` (see the module docstring for the rules)."""

    def __init__(self, dataset: Dataset | np.ndarray | Sequence[int], config: SamplerConfig) -> None:
        if not isinstance(dataset, Dataset):
            dataset = Dataset(name="lengths", lengths=np.asarray(dataset), source="in-memory array")
        self.dataset = dataset
        self.config = config
        self.cut = context_cut(dataset.lengths, config.max_context, drop_long=config.drop_long)
        """Documents longer than ``max_context`` (chunked, or dropped with ``drop_long``), per epoch."""
        self.num_long_docs = self.cut.num_cut_docs
        self.num_dropped_docs = self.num_long_docs if config.drop_long else 0
        """Documents skipped per epoch."""
        self.num_dropped_tokens = self.cut.num_dropped_tokens
        """Tokens skipped per epoch."""
        self.tokens_per_epoch = dataset.stats.total_tokens - self.num_dropped_tokens
        """Tokens the stream yields per epoch."""
        self.samples_per_epoch = len(dataset) - self.num_dropped_docs + self.cut.num_extra_samples
        """Samples the stream yields per epoch (documents, or their chunks)."""
        if self.samples_per_epoch > MAX_EPOCH_SAMPLES:
            raise UserError(
                f"dataset {dataset.name!r} makes {self.samples_per_epoch:,} samples per epoch at max_context "
                f"{config.max_context:,} ({dataset.stats.total_tokens:,} tokens in {len(dataset):,} documents), "
                f"more than the {MAX_EPOCH_SAMPLES:,} the sampler holds: "
                + ("raise max_context (e.g. 32K)" if self.cut.num_extra_samples > len(dataset)
                   else "use fewer documents"))
        if self.tokens_per_epoch == 0:
            raise UserError(f"dataset {dataset.name!r}: every document is longer than max_context "
                            f"({config.max_context}) and drop_long is set: nothing to sample")
        # A batch much larger than the dataset wraps round it epoch after epoch: refuse it before
        # the sampler walks those epochs one by one (10**8 of them for 1G tokens of a 30-token set).
        whole_epochs = config.global_batch_tokens // self.tokens_per_epoch
        if whole_epochs * self.samples_per_epoch > MAX_BATCH_SAMPLES:
            raise UserError(f"a batch of {config.global_batch_tokens:,} tokens runs {whole_epochs:,} times or more "
                            f"through dataset {dataset.name!r} ({self.tokens_per_epoch:,} tokens, "
                            f"{self.samples_per_epoch:,} samples): at least {whole_epochs * self.samples_per_epoch:,} "
                            f"samples, more than the {MAX_BATCH_SAMPLES:,} a plan may hold: lower "
                            f"global_batch_tokens or use a larger dataset")
        self._starts: dict[int, tuple[int, int]] = {0: (0, 0)}
        """Step -> stream position (epoch, index) where its batch starts, for the steps reached so far
        (and any restored with ``set_start``)."""

    # ------------------------------------------------------------ public

    def batch_at(self, step: int) -> Batch:
        """The batch of optimizer step ``step`` (>= 0); same dataset + config + step => same batch."""
        step = _step_index(step)
        (e0, i0), (e1, i1) = self.start(step), self.start(step + 1)
        count = (e1 - e0) * self.samples_per_epoch + i1 - i0
        if count > MAX_BATCH_SAMPLES:
            raise UserError(f"the batch of step {step} holds {count:,} samples ({self.config.global_batch_tokens:,} "
                            f"tokens at max_context {self.config.max_context:,}), more than the "
                            f"{MAX_BATCH_SAMPLES:,} a plan may hold: raise max_context or lower global_batch_tokens")
        key = (id(self.dataset.lengths), self.config, step, e0, i0, e1, i1)
        cached = _batches.get(key)
        if cached is None:  # (first in, first out: no reordering, which a planning thread could race)
            cached = _batches[key] = (self.dataset.lengths, self._build_batch(step, (e0, i0), (e1, i1)))
            while len(_batches) > _BATCH_CACHE:
                _batches.popitem(last=False)
        return cached[1]

    def _build_batch(self, step: int, begin: tuple[int, int], end: tuple[int, int]) -> Batch:
        (e0, i0), (e1, i1) = begin, end
        samples: list[DocumentChunk] = []
        for epoch in range(e0, e1 + 1):
            stream = self._epoch(epoch)
            start = i0 if epoch == e0 else 0
            stop = i1 if epoch == e1 else len(stream.length)
            columns = (stream.length[start:stop].tolist(), stream.doc_index[start:stop].tolist(),
                       stream.chunk[start:stop].tolist())
            for length, doc_index, chunk in zip(*columns, strict=True):
                samples.append(DocumentChunk(id=len(samples), length=length, doc_index=doc_index,
                                      chunk=chunk, epoch=epoch))
        docs, tokens = (b - a for a, b in zip(self._dropped_before(e0, i0),
                                              self._dropped_before(e1, i1), strict=True))
        return Batch(step=step, samples=tuple(samples), num_dropped_docs=docs,
                     num_dropped_tokens=tokens)

    def samples_before(self, step: int) -> int:
        """How many samples the stream yields in batches ``0 .. step - 1`` (every epoch yields the
        same number, whatever its order): a run-wide id for a batch's first sample, found without
        building the earlier batches."""
        epoch, index = self.start(_step_index(step))
        return epoch * self.samples_per_epoch + index

    def start(self, step: int) -> tuple[int, int]:
        """Stream position (epoch, index) where batch ``step`` starts: walked on from the nearest
        earlier step whose start is known (each batch end is one binary search)."""
        if step not in self._starts:
            known = step - 1 if step - 1 in self._starts else max(k for k in self._starts if k < step)
            position = self._starts[known]
            for later in range(known + 1, step + 1):
                position = self._next_end(position)
                self._starts[later] = position
        return self._starts[step]

    def set_start(self, step: int, position: Sequence[int]) -> None:
        """Restore where batch ``step`` starts (from ``start(step)`` of an earlier run on the same
        data and config), so that reaching it needs no walk over the batches before it."""
        epoch, index = (int(x) for x in position)
        if step < 0 or epoch < 0 or not 0 <= index < self.samples_per_epoch:
            raise UserError(f"step {step} cannot start at stream position {tuple(position)} "
                            f"({self.samples_per_epoch} samples per epoch)")
        self._starts[step] = (epoch, index)

    def batches(self, num_steps: int, *, start: int = 0) -> list[Batch]:
        """Batches of steps ``start .. start + num_steps - 1``."""
        return [self.batch_at(step) for step in range(start, start + num_steps)]

    def __iter__(self) -> Iterator[Batch]:
        """Endless: step 0, 1, 2, ... (epochs wrap around)."""
        step = 0
        while True:
            yield self.batch_at(step)
            step += 1

    def dropped_through(self, step: int) -> tuple[int, int]:
        """(documents, tokens) skipped by ``drop_long`` in batches 0..step together."""
        self.batch_at(step)
        return self._dropped_before(*self.start(step + 1))

    # ------------------------------------------------------------ internals

    def _next_end(self, position: tuple[int, int]) -> tuple[int, int]:
        """Where the batch starting at ``position`` ends: greedy fill up to the budget."""
        epoch, index = position
        room = self.config.global_batch_tokens
        while True:
            stream = self._epoch(epoch)
            # Largest stop with cum[stop] - cum[index] <= room: one binary search per batch.
            stop = int(np.searchsorted(stream.cum, stream.cum[index] + room, side="right")) - 1
            room -= int(stream.cum[stop] - stream.cum[index])
            if stop < len(stream.length):
                assert stop > index or room < self.config.global_batch_tokens, "empty batch"
                return (epoch, stop)
            epoch, index = epoch + 1, 0  # this epoch is used up: go on with the next one

    def _dropped_before(self, epoch: int, index: int) -> tuple[int, int]:
        """Skipped (docs, tokens) in the stream up to the sample before position (epoch, index).

        Counting up to the last *taken* sample (not up to the position) charges the skipped
        documents at an epoch's end to the batch that takes the next epoch's first sample.
        """
        if not self.config.drop_long:
            return (0, 0)
        if index == 0 and epoch > 0:  # the sample before is the previous epoch's last one
            epoch -= 1
            index = len(self._epoch(epoch).length)
        stream = self._epoch(epoch)
        consumed = int(stream.docs_before[index])
        return (epoch * self.num_dropped_docs + int(stream.dropped_docs[consumed]),
                epoch * self.num_dropped_tokens + int(stream.dropped_tokens[consumed]))

    def _epoch(self, epoch: int) -> _Epoch:
        config, lengths = self.config, self.dataset.lengths
        key = (id(lengths), config.max_context, config.drop_long, config.shuffle,
               (config.seed, epoch) if config.shuffle else None)  # unshuffled epochs are all alike
        if key not in _epochs:
            _epochs[key] = (lengths, self._build_epoch(epoch))
            while len(_epochs) > _EPOCH_CACHE:
                _epochs.popitem(last=False)
        _epochs.move_to_end(key)
        return _epochs[key][1]

    def _build_epoch(self, epoch: int) -> _Epoch:
        lengths = self.dataset.lengths
        context = self.config.max_context
        if self.config.shuffle:
            order = np.random.default_rng([self.config.seed, epoch]).permutation(lengths.size)
        else:
            order = np.arange(lengths.size)
        visited = lengths[order]
        skipped = visited > context if self.config.drop_long else np.zeros(visited.size, dtype=bool)
        # Samples per visited document: 0 or 1 when dropping, else ceil(length / context) chunks.
        counts = np.where(skipped, 0, 1) if self.config.drop_long else -(-visited // context)
        position = np.repeat(np.arange(visited.size), counts)  # place in the visiting order
        first = np.repeat(np.cumsum(counts) - counts, counts)
        chunk = np.arange(position.size) - first
        length = np.minimum(context, visited[position] - chunk * context)
        assert length.min() >= 1 and length.max() <= context
        empty = np.zeros(0, dtype=np.int64)
        drop = self.config.drop_long  # the drop bookkeeping is only kept when it can be non-zero
        return _Epoch(
            length=length, doc_index=order[position], chunk=chunk,
            cum=np.concatenate([[0], np.cumsum(length)]),
            docs_before=np.concatenate([[0], position + 1]) if drop else empty,
            dropped_docs=np.concatenate([[0], np.cumsum(skipped)]) if drop else empty,
            dropped_tokens=np.concatenate([[0], np.cumsum(np.where(skipped, visited, 0))])
            if drop else empty,
        )


def _step_index(step: object) -> int:
    """``step`` as a non-negative int (numpy integers accepted; floats and strings refused)."""
    try:
        value = operator.index(step)  # type: ignore[call-overload]
    except TypeError:
        raise UserError(f"step must be a non-negative integer, got {step!r}") from None
    if value < 0:
        raise UserError(f"step must be a non-negative integer, got {step!r}")
    return value


def sample_batches(dataset: Dataset | str, config: SamplerConfig, num_steps: int, *,
                   start: int = 0) -> list[Batch]:
    """Convenience: ``num_steps`` batches from step ``start`` of a dataset (or a name/path)."""
    if isinstance(dataset, str):
        from slimpack.data.dataset import load_dataset
        dataset = load_dataset(dataset)
    return GlobalBatchSampler(dataset, config).batches(num_steps, start=start)
