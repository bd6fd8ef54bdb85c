"""One strategy fed step after step from a data stream: the one place that turns the sampler's
batches into plan samples, tracks what a strategy holds back, drains it, seeks and checkpoints.

Rules (compare, the training loader and ``slimpack plan`` all see steps made this way):

- **Ids.** A sample's plan id is its position in the whole stream: the number of samples in the
  batches before its step plus its id in its batch. Ids are unique across a run and do not depend
  on where a run started, so a stream that seeks to step 10,000 gives the same plan as one that
  walked there.
- **Cut documents** (``TrainConfig.cut_documents``). Each batch's documents are cut where
  fixed-length sequences of ``max_context`` tokens end (``fixed.pack_fixed_length``, the cut
  ``fixed`` and SlimPipe make), and each piece is a sample: the sample with id p becomes piece 2p
  and, where a boundary cuts it, piece 2p + 1 (a sample is at most ``max_context`` tokens, so one
  boundary cuts it at most once). Ids stay unique and seek-proof; every strategy trains the same
  pieces.
- **Arrival.** A sample's ``arrival_step`` is the step whose batch brought it. A strategy that
  defers samples (``Plan.deferred``) keeps them and puts them back in a later plan with that
  arrival step; the stream keeps their data identity (document, chunk) until they are trained.
- **Drain.** ``drain()`` plans a step with no new samples, which tells a deferring strategy that
  the data has ended and it must release what it holds (``held_tokens`` says how much).
- **Seek.** A stateless strategy's plan of step I depends on step I's batch alone: seeking costs
  one sampler lookup. A stateful one (``stateful = True``: WLB-LLM's queues) either replays the
  steps in between or is restored from ``state_dict()``, which holds its state, the samples it
  holds and where the next batch starts in the data stream (so a restore walks no earlier batch).

Must not import torch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from slimpack.config import Config
from slimpack.data import Dataset, DocumentChunk, GlobalBatchSampler, SamplerConfig
from slimpack.errors import UserError
from slimpack.plan.types import Plan, Sample
from slimpack.strategies import make_planner
from slimpack.strategies.base import Planner
from slimpack.strategies.fixed import pack_fixed_length

STATE_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedStep:
    """One step of a stream: its plan and what it trains."""

    step: int
    plan: Plan
    planner_time_s: float
    """Wall time of the planner call alone."""
    planner_cpu_s: float = 0.0
    """CPU time of the planner call alone (on a shared machine, its wall time less the waits)."""
    sources: Mapping[int, DocumentChunk]
    """Plan sample id -> the sampler's sample (document, chunk) of the samples this step trains; a
    piece a strategy cut off a document itself (``fixed`` at a sequence boundary) has none."""
    arrived: tuple[Sample, ...] = ()
    """The step's new samples as the data stream gave them (before a strategy cuts any)."""
    drain: bool = False
    """A step past the end of the data: no new samples, the strategy trains what it still held."""

    @property
    def trained(self) -> tuple[Sample, ...]:
        return self.plan.trained_samples

    @property
    def trained_tokens(self) -> int:
        return sum(s.length for s in self.plan.trained_samples)

    @property
    def trained_document_lengths(self) -> list[int]:
        """Lengths of the whole samples this step trains, as the data stream gave them: those carried
        in from earlier steps and this step's new ones, less the deferred. A strategy may cut a sample
        into pieces (``fixed``); the work of the whole samples is the same for every strategy."""
        deferred = set(self.plan.deferred)
        carried = [s.length for s in self.plan.trained_samples if s.arrival_step < self.step]
        return carried + [s.length for s in self.arrived if s.id not in deferred]

    @property
    def pieces_cut_off(self) -> int:
        """Samples this step trains beyond its documents: the pieces a strategy cut off documents
        at sequence boundaries (``fixed``, SlimPipe; 0 for a plan of whole documents)."""
        return len(self.plan.trained_samples) - len(self.trained_document_lengths)

    @property
    def delayed_token_steps(self) -> int:
        """Σ tokens × steps waited, over the samples this step trains."""
        return sum(s.length * (self.step - s.arrival_step) for s in self.plan.trained_samples)


def step_samples(sampler: GlobalBatchSampler, step: int, *,
                 cut_documents: bool = False) -> dict[int, tuple[Sample, DocumentChunk]]:
    """Step ``step``'s new samples by plan id, with the sampler's sample each comes from (with
    ``cut_documents``, the pieces of the sequence cut: module docstring)."""
    first = sampler.samples_before(step)
    new = {first + s.id: (Sample(id=first + s.id, length=s.length, arrival_step=step), s)
           for s in sampler.batch_at(step).samples}
    return cut_at_sequences(new, sampler.config.max_context) if cut_documents else new


def cut_at_sequences(new: dict[int, tuple[Sample, DocumentChunk]],
                     context: int) -> dict[int, tuple[Sample, DocumentChunk]]:
    """``new`` (one batch, by plan id, in stream order) cut where ``fixed.pack_fixed_length``'s
    ``context``-token sequences end: each piece a sample, ids as in the module docstring."""
    pieces, _ = pack_fixed_length([sample for sample, _ in new.values()], context)
    out: dict[int, tuple[Sample, DocumentChunk]] = {}
    for piece in pieces:  # a sample's pieces come in order, its first under its own id
        if piece.id in new:
            whole, source = new[piece.id]
            part, before = 0, 0  # the piece's number within its sample, the sample's tokens before it
        else:
            part += 1
            assert part == 1, "a sample of at most the context crosses at most one sequence boundary"
        pid = 2 * whole.id + part
        out[pid] = (Sample(id=pid, length=piece.length, arrival_step=whole.arrival_step),
                    dataclasses.replace(source, length=piece.length, offset=source.offset + before))
        before += piece.length
    return out


def stream_batches(dataset: Dataset, config: Config, num_steps: int, *, shuffle: bool = False) -> list[list[Sample]]:
    """The new samples of steps ``0 .. num_steps - 1`` as a strategy sees them (for code that needs
    the lengths ahead, e.g. ``tune``'s time floors)."""
    sampler = GlobalBatchSampler(dataset, SamplerConfig.from_train(config.train, shuffle=shuffle))
    return [[sample for sample, _ in step_samples(sampler, step, cut_documents=config.train.cut_documents).values()]
            for step in range(num_steps)]


class PlanStream:
    """Plans of ``strategy`` for steps ``start, start + 1, …`` of ``dataset``'s batch stream."""

    def __init__(self, dataset: Dataset, config: Config, strategy: str, *, shuffle: bool = False,
                 start: int = 0) -> None:
        self.config = config
        self.strategy = strategy
        self.sampler = GlobalBatchSampler(dataset, SamplerConfig.from_train(config.train, shuffle=shuffle))
        self.planner: Planner = make_planner(strategy, config)
        self.step = 0
        """The next step ``next()`` plans."""
        self._held: dict[int, tuple[Sample, DocumentChunk]] = {}
        """Samples the strategy holds back (deferred by its last plan), by plan id."""
        self.seek(start)

    @property
    def stateful(self) -> bool:
        return bool(getattr(self.planner, "stateful", False))

    @property
    def held_tokens(self) -> int:
        """Tokens the strategy holds back for later steps."""
        return sum(sample.length for sample, _ in self._held.values())

    def batch(self, step: int) -> dict[int, tuple[Sample, DocumentChunk]]:
        """Step ``step``'s new samples by plan id (see the module docstring for the ids)."""
        return step_samples(self.sampler, step, cut_documents=self.config.train.cut_documents)

    # ---- stepping ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[PlannedStep]:
        return self

    def __next__(self) -> PlannedStep:
        try:
            new = self.batch(self.step)
        except UserError:  # a batch that cannot be made fails its step, and the stream moves on
            self.step += 1
            raise
        return self._plan(new, drain=False)

    def drain(self) -> PlannedStep:
        """Plan a step with no new samples: the data has ended, the strategy releases what it holds
        (call it while ``held_tokens`` is not 0)."""
        return self._plan({}, drain=True)

    def _plan(self, new: dict[int, tuple[Sample, DocumentChunk]], *, drain: bool) -> PlannedStep:
        """Plan the current step from ``new``; the stream moves on even when the planner fails (the
        failed step's samples are then lost to this stream, as they would be to a training run)."""
        step = self.step
        self.step += 1
        began, began_cpu = time.perf_counter(), time.process_time()
        plan = self.planner.plan([sample for sample, _ in new.values()], step=step)
        elapsed, cpu = time.perf_counter() - began, time.process_time() - began_cpu
        known = self._held | new
        sources = {s.id: known[s.id][1] for s in plan.trained_samples if s.id in known}
        self._held = {sid: known[sid] for sid in plan.deferred}
        return PlannedStep(step=step, plan=plan, planner_time_s=elapsed, planner_cpu_s=cpu, sources=sources,
                           arrived=tuple(sample for sample, _ in new.values()), drain=drain)

    # ---- seeking and checkpoints ---------------------------------------------------------------
    def seek(self, step: int) -> None:
        """Make ``step`` the next step planned. A stateful strategy replays the steps in between
        (from step 0, or from its last reset, when seeking back or far ahead); restore it with
        ``load_state_dict`` to skip the replay."""
        if step < 0:
            raise UserError(f"step must be >= 0, got {step}")
        if not self.stateful:
            self.step = step
            return
        # a planner whose state a full search replaces every ``resets_every`` steps (SlimPack's search
        # seed) replays from the last such step; any other stateful planner from step 0
        period = getattr(self.planner, "resets_every", None)
        restart = step - step % period if period else 0
        if step < self.step or restart > self.step:
            self.planner = make_planner(self.strategy, self.config)
            self.step, self._held = restart, {}
        while self.step < step:
            next(self)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands: the next step, the samples held back and the planner's state."""
        held = [[s.id, s.length, s.arrival_step, d.id, d.doc_index, d.chunk, d.epoch, d.offset]
                for s, d in self._held.values()]
        planner = self.planner.state_dict() if self.stateful else None  # type: ignore[attr-defined]
        return {"version": STATE_VERSION, "strategy": self.strategy, "step": self.step, "held": held,
                "planner": planner, "data": self._data_fingerprint(),
                "sampler_start": list(self.sampler.start(self.step))}

    def _data_fingerprint(self) -> dict[str, int]:
        """What a checkpoint must agree with to be restored here (same data, context and budget)."""
        pieces = {"cut_documents": True} if self.config.train.cut_documents else {}  # ids differ with it
        return {"samples_per_epoch": self.sampler.samples_per_epoch,
                "tokens_per_epoch": self.sampler.tokens_per_epoch,
                "global_batch_tokens": self.sampler.config.global_batch_tokens, **pieces}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != STATE_VERSION or state.get("strategy") != self.strategy:
            raise UserError(f"stream state (version {state.get('version')!r}, strategy "
                            f"{state.get('strategy')!r}) is not a version-{STATE_VERSION} state for "
                            f"strategy {self.strategy!r}")
        if state.get("data") != self._data_fingerprint():
            raise UserError(f"stream state is for other data or batches ({state.get('data')}); this stream has "
                            f"{self._data_fingerprint()}")
        self.step = int(state["step"])
        self.sampler.set_start(self.step, state["sampler_start"])
        self._held = {}
        for sid, length, arrival, batch_id, doc_index, chunk, epoch, *offset in state["held"]:
            # a state written before pieces had offsets holds whole chunks (offset 0)
            self._held[sid] = (Sample(id=sid, length=length, arrival_step=arrival),
                               DocumentChunk(id=batch_id, length=length, doc_index=doc_index, chunk=chunk,
                                             epoch=epoch, offset=offset[0] if offset else 0))
        if self.stateful:
            self.planner = make_planner(self.strategy, self.config)
            self.planner.load_state_dict(state["planner"])  # type: ignore[attr-defined]
