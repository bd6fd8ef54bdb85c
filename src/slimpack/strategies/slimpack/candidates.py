"""Never behind, never out of memory: SlimPack's plan against whole-sample packings of the same batch.

SlimPack's own candidates (K, slicing, backward grouping, look-ahead, DP-Merge) are scored on the
pipelines that decide the step. The planner then also builds the plans of the baselines that train
exactly the same documents (whole samples, symmetric groups, 1F1B: ByteScale's FLOP buckets, TRL's
best-fit-decreasing, verl's Karmarkar-Karp, and WLB-LLM's packing where it defers no document to a
later step), and SlimPipe's slice-level 1F1B over best-fit-decreasing
sequences of whole documents, scores them with the same simulator and returns the fastest plan that
fits in memory, saying in ``info["candidate"]`` which one won. Fixed-length packing and SlimPipe
itself are candidates only where their cut splits no document (``FIXED_LENGTH``): elsewhere they
split documents at sequence boundaries, which changes what is trained.
If no candidate fits, the planner raises one error that says what would make one fit.
Must not import torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np

from slimpack.cost import CostModel, model_training_flops
from slimpack.errors import ScheduleError, UserError
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice, group_tokens, with_default_orders
from slimpack.sim import pipelines_step_time
from slimpack.strategies.base import cut_to_context, lpt_assign, members, symmetric_replica, whole
from slimpack.strategies.fixed import pack_fixed_length
from slimpack.strategies.micro_batches import micro_batch_caps
from slimpack.strategies.packing import best_fit_decreasing
from slimpack.strategies.slimpack.memory import stage_peak_bytes

BASELINE_CANDIDATES = ("bytescale", "bfd", "kk", "wlb")
CLEAR_LEAD = 0.05
"""When SlimPack's plan simulates this much faster than its own whole-sample packing (same
pipelines, same simulator) and than best-fit-decreasing's plan (``reference_candidate``), the
whole-sample candidates are not built: they are packings of the same kind, and building and
simulating them would double the planner's time where SlimPack leads. The slice-level ones are
always tried (they are a different schedule, and cheap to give up)."""
KK_MAX_SAMPLES = 8192
"""Karmarkar-Karp's planning time grows with the batch (one core, wikipedia: 0.06-0.23 s at ~8K
samples, 0.4-0.5 s at ~16.7K, 1.1 s at ~25K, measured while two other processes ran): above this
many samples it is left out of the candidates. At 4,096 it was left out of stress cell 125 (4,391
samples), where it plans 1% faster than SlimPack's own plan."""
CANDIDATES_MAX_SAMPLES = 24576
"""Above this many samples (about 384 GPUs at 64K tokens per GPU on wikipedia) the candidates are
built only when SlimPack's own plan does not fit, but for ``reference_candidate`` where SlimPack's
lead over its own whole-sample packing is not clear: planning and simulating all of them costs more
than the planner's latency budget there, where SlimPack's margin is widest. In an out-of-band probe
cell (llama2-13b, documents of a few hundred tokens, 33,540 of them, tp8 pp4 vpp2 dp2, a lead of
0.998) SlimPack's own plan was 0.7% behind best-fit-decreasing's. Under a clear lead even the
reference is not built: its bins alone take about 0.4 s at 2048 GPUs (133,260 samples), a third of
the planner's median step there."""


def plan_peaks(plan: Plan, cost: CostModel) -> list[float]:
    """Per pipeline, the peak bytes of its most loaded device (exact, from the orders alone)."""
    return [max(stage_peak_bytes(pipe, pipe.order, plan.config, cost))  # a Plan carries its orders
            for pipe in plan.pipelines]


def plan_fits(plan: Plan, cost: CostModel) -> bool:
    usable = plan.config.cluster.usable_memory_bytes
    return all(peak <= usable for peak in plan_peaks(plan, cost))


def baseline_plans(batch: Sequence[Sample], step: int, config) -> list[Plan]:
    """The baseline candidates' plans of ``batch``, at each of ``micro_batch_caps`` (each plan keeps
    the config it was planned with); a baseline that cannot plan it (e.g. under interleaving, a group
    count that is not a multiple of pp) is left out, and so is a plan that holds documents back for a
    later step (WLB-LLM's deferral: SlimPack trains the batch it is given)."""
    from slimpack.strategies import make_planner  # the registry imports this package

    plans = []
    for cap in micro_batch_caps(config):
        capped = (config if cap == config.train.micro_batch_cap
                  else dataclasses.replace(config, train=dataclasses.replace(config.train, micro_batch_tokens=cap)))
        for name in BASELINE_CANDIDATES:
            if name == "kk" and len(batch) > KK_MAX_SAMPLES:
                continue
            try:
                plan = make_planner(name, capped).plan(batch, step=step)
            except ScheduleError:
                continue
            if not plan.deferred:
                plans.append(plan)
    return plans


@dataclass(frozen=True, slots=True)
class Candidate:
    """A whole-document candidate plan whose pipelines are built one at a time, so that building
    stops as soon as the simulation of those built rules the plan out (the step ends after every
    pipeline's last backward: a plan is at least as slow as any of its pipelines alone)."""

    pipelines: Callable[[], Iterator[tuple[int, PipelinePlan]]]
    """Its pipelines, each with its index in the plan, built as they are asked for."""
    assemble: Callable[[list[PipelinePlan]], Plan]
    """The plan of all its pipelines (given in plan order)."""

    @staticmethod
    def of(plan: Plan) -> Candidate:
        """A candidate already planned."""
        return Candidate(pipelines=lambda: enumerate(plan.pipelines), assemble=lambda _: plan)


EQUAL_TOKENS = "equal tokens"
"""The spread that packs the batch into as many sequences as Megatron's fixed-length cut makes
(``_replica_sequences``), each document whole."""
SEQUENCE_SPREADS = ("documents", "sequences", EQUAL_TOKENS)
"""How ``sliced_sequence_plans`` spreads the batch over the replicas (and, where Megatron's
fixed-length cut leaves every document whole, ``FIXED_LENGTH`` too). None wins everywhere. Of the
first two, of 199 comparisons in the stress cells without interleaving (the slice-level candidate
alone, where it fits, on the documents and on the fixed-length pieces), dealing the documents was
faster in 68 (3.4-3.9% at stress cell 8 and up to 1.96x at cell 182, where two long sequences went
to one replica) and dealing the sequences in 14 (up to 1.1%: the documents can leave one replica with an
extra, part-filled sequence); the rest were within 0.1%. ``EQUAL_TOKENS`` (thirty-fifth session)
packs as Megatron's cut does, but whole documents: as many sequences, of about equal tokens, the
same count on every replica. In stress probe seed 409, cell 12 (llama3-8b, 256K, pp 8, 2 replicas),
at 8 slices: documents dealt first 4.19 s (9 and 8 sequences), sequences dealt 4.29 s (8 and 8,
full but unequal in FLOPs), equal tokens 4.05 s; SlimPipe on the cut pieces 4.05 s."""
FIXED_LENGTH = "fixed-length"
"""The spread of SlimPipe itself: the batch in data order cut into context-length sequences, dealt
round-robin (``fixed.pack_fixed_length``). A candidate only where that cut splits no document
(``cuts_no_document``, e.g. a corpus already chunked to the context): then it trains what SlimPack
trains, and SlimPack is never behind SlimPipe or Megatron's fixed-length packing there."""


def cuts_no_document(samples: Sequence[Sample], context: int) -> bool:
    """Whether Megatron's fixed-length cut of ``samples`` (in this order) into ``context``-token
    sequences leaves every one of them whole: none starts in one sequence and ends in the next."""
    lengths = np.fromiter((s.length for s in samples), dtype=np.int64, count=len(samples))
    ends = np.cumsum(lengths)
    return bool(np.all((ends - lengths) // context == (ends - 1) // context))


def uncut_fixed_plans(batch: Sequence[Sample], step: int, config) -> list[Plan]:
    """Megatron's fixed-length packing's plan of ``batch`` where its cut leaves every document whole
    (``cuts_no_document``; documents longer than the context cut first, as every candidate does):
    under interleaving, where the slice-level candidates are not built, this is the only plan of
    that spread (a probe cell on the fixed-length pieces, tp2 pp4 vpp4 cp4 dp8: SlimPack 0.991x of
    it without)."""
    from slimpack.strategies import make_planner  # the registry imports this package

    samples = cut_to_context(batch, config.train.max_context)
    if not cuts_no_document(samples, config.train.max_context):
        return []
    try:
        return [make_planner("fixed", config).plan(samples, step=step)]
    except ScheduleError:
        return []


def sliced_sequence_plans(batch: Sequence[Sample], step: int, config, *,
                          first: tuple[str, int] | None = None) -> list[Candidate]:
    """SlimPipe's slice-level 1F1B over whole documents: best-fit-decreasing sequences (each within
    the context), each cut into n slices of equal cost. Where memory is tight this holds far fewer
    activations than 1F1B over whole sequences, and unlike SlimPipe itself no document is cut at a
    sequence boundary. n = 1 is plain 1F1B over the whole sequences, which TRL's packing (``bfd``)
    also runs but with the sequences dealt by tokens; it is tried here also where a clear lead
    skips the whole-sample candidates (two probe cells on the fixed-length pieces, where SlimPipe
    won with whole sequences: 0.983x and 0.986x of it without, 1.005x and 1.002x with).
    Three ways to spread the documents over the replicas (two with a single replica): the sequences
    of the whole batch dealt by their FLOPs; the documents dealt by their FLOPs, then packed into
    sequences on each replica; and as many sequences of about equal tokens as the fixed-length cut
    makes, dealt by their FLOPs (``_replica_sequences``). Their pipelines are built the most tokens
    first (the likeliest to rule a candidate out). ``first``: the (spread, slice count) to put
    first, the previous step's winner (consecutive batches are alike): tried first, it sets the bar
    the others are given up against after fewer pipelines."""
    from slimpack.strategies.slimpipe import SlimPipePlanner  # the registry imports this package

    if config.parallel.virtual_stages > 1 or not config.planner.use_slicing:
        return []
    planner = SlimPipePlanner(config)
    samples = cut_to_context(batch, config.train.max_context)
    # one replica: dealing the documents first packs what dealing the sequences packs
    spreads = SEQUENCE_SPREADS if config.parallel.dp > 1 else ("sequences", EQUAL_TOKENS)
    if cuts_no_document(samples, config.train.max_context):
        spreads = (*spreads, FIXED_LENGTH)

    def pipelines(own: list[list[list[Slice]]], heavy_first: list[int], n: int) -> Iterator[tuple[int, PipelinePlan]]:
        return ((r, planner.pipeline(own[r], r, n)) for r in heavy_first)

    def assemble(spread: str, n: int, built: list[PipelinePlan]) -> Plan:
        plan = planner.assemble(samples, built, n, step)
        return dataclasses.replace(plan, info={**plan.info, "spread": spread})

    documents = _Documents.of(samples, config)
    owned = {}  # per spread: its replicas' sequences, and the replicas the most tokens first
    for spread in spreads:
        own = _replica_sequences(documents, spread, config)
        tokens = [sum(map(group_tokens, sequences)) for sequences in own]
        owned[spread] = own, sorted(range(len(own)), key=lambda r: (-tokens[r], r))
    keys = sorted(((spread, n) for spread in spreads for n in planner.candidates), key=lambda k: k != first)
    return [Candidate(pipelines=partial(pipelines, *owned[spread], n), assemble=partial(assemble, spread, n))
            for spread, n in keys]


class _Documents(NamedTuple):
    """A batch as every spread reads it, made once: its samples, each as one whole slice, their
    tokens and their training FLOPs."""

    samples: Sequence[Sample]
    slices: list[Slice]
    lengths: np.ndarray
    flops: np.ndarray

    @staticmethod
    def of(samples: Sequence[Sample], config) -> _Documents:
        lengths = np.array([s.length for s in samples], dtype=np.int64)
        return _Documents(samples, [whole(s) for s in samples], lengths,
                          model_training_flops(config.model, lengths.astype(np.float64)))

    def heaviest_first(self, bins: list[list[list[int]]]) -> list[list[list[Slice]]]:
        """Per replica, its bins of sample indices as sequences of whole samples, the most FLOPs first."""
        return [[[self.slices[i] for i in b] for b in sorted(own, key=lambda b: -self.flops[b].sum())]
                for own in bins]


def _replica_sequences(documents: _Documents, spread: str, config) -> list[list[list[Slice]]]:
    """Per replica, its sequences, heaviest first.
    ``sequences``: the batch is packed best-fit-decreasing within the context, then its sequences
    dealt by their FLOPs; ``documents``: the documents are dealt by their FLOPs, then each replica
    packs its own so; ``EQUAL_TOKENS``: the batch goes into as many sequences per replica as the
    fixed-length cut needs, ceil(tokens / (context x replicas)), each document to the sequence with
    the fewest tokens so far, longest first (so about equal tokens: at most the shortest documents
    past the context), then the same count of sequences dealt to every replica by their FLOPs;
    ``FIXED_LENGTH``: SlimPipe's sequences and order (for a batch that cut leaves whole). The first
    three deal by FLOPs (longest-processing-time first), not round-robin: best-fit-decreasing puts
    the longest documents (the most attention) in the first sequences, and dealing those in turn
    gives the first replica the heavier of every pair (stress cell 67: 3.62 s against 3.45 s for
    SlimPipe's equal fixed-length sequences)."""
    context, dp = config.train.max_context, config.parallel.dp
    if spread == FIXED_LENGTH:  # SlimPipe's own: data order, dealt in turn
        _, sequences = pack_fixed_length(documents.samples, context)
        return [sequences[r::dp] for r in range(dp)]
    lengths, flops = documents.lengths, documents.flops
    if spread == "documents":
        mine = members(lpt_assign(flops.tolist(), dp), dp)
        return documents.heaviest_first([[[mine[r][i] for i in b] for b in best_fit_decreasing(
            lengths[mine[r]].tolist(), context)] for r in range(dp)])
    if spread == EQUAL_TOKENS:
        count = dp * max(1, math.ceil(int(lengths.sum()) / (context * dp)))  # the cut's, dealt evenly
        every = [b for b in members(lpt_assign(lengths.tolist(), count), count) if b]  # fewer documents than sequences
        owner = lpt_assign([float(flops[b].sum()) for b in every], dp, most_items=math.ceil(len(every) / dp))
    else:
        every = best_fit_decreasing(lengths.tolist(), context)
        owner = lpt_assign([float(flops[b].sum()) for b in every], dp)
    return documents.heaviest_first([[every[i] for i in mine] for mine in members(owner, dp)])


def fastest_fitting(candidates: Sequence[Candidate], cost: CostModel, *, beat: float = float("inf")
                    ) -> tuple[Plan, float] | None:
    """The candidate plan that fits in memory with the shortest simulated step, and that step's
    time (the first of equals; None if none fits). Only plans faster than ``beat`` count: a plan is
    given up as soon as its simulation (or its probe's) shows it cannot beat that or the fastest so
    far."""
    best: tuple[Plan, float] | None = None
    for candidate in candidates:
        bar = beat if best is None else best[1]  # a best so far is faster than ``beat``
        built: dict[int, PipelinePlan] = {}
        time_s = pipelines_step_time(cost.config, _kept(candidate.pipelines(), built), cost, give_up_at=bar)
        if time_s >= bar:
            continue
        plan = candidate.assemble([built[p] for p in sorted(built)])
        if plan_fits(plan, cost):
            best = (plan, time_s)
    return best


def _kept(pipelines: Iterator[tuple[int, PipelinePlan]], into: dict[int, PipelinePlan]
          ) -> Iterator[tuple[int, PipelinePlan]]:
    """``pipelines``, each also kept in ``into`` by its index as it goes by."""
    for index, pipe in pipelines:
        into[index] = pipe
        yield index, pipe


def safest_plan(plan: Plan, batch: Sequence[Sample], cost: CostModel, *, fitting: bool, lead: float,
                sliced_first: tuple[str, int] | None = None) -> Plan:
    """``plan`` (SlimPack's, with its simulated step in ``info["step_s"]``; ``fitting``: every
    pipeline fits) or a candidate's plan that the simulator finds faster, or that fits when
    ``plan`` does not (its simulated step in ``info["step_s"]`` too). ``lead``: SlimPack's
    simulated step over its own whole-sample packing's (scored on the same pipelines); with a
    clear lead (``CLEAR_LEAD``) the whole-sample candidates are skipped; ``sliced_first``: the slice-level candidate
    to try first (``sliced_sequence_plans``). Raises a ``UserError`` when nothing fits."""
    # with a clear lead, over its own whole-sample packing and over best-fit-decreasing's plan, the
    # whole-sample baselines are skipped (in the stress sweep none won a cell where SlimPack's lead
    # over its own whole-sample packing was under 0.987), but slice-level
    # 1F1B over best-fit sequences still can: where memory is tight (it holds less), and on deep
    # pipelines with a few long sequences per replica (stress cell 91 on the fixed-length pieces,
    # pp 8 at 256K: SlimPack's plan led its whole-sample packing by 20% and was 0.948x SlimPipe;
    # this candidate 0.985x). With both spreads (``SEQUENCE_SPREADS``) the planner's median step at
    # 256 GPUs takes 0.50 s instead of 0.32 s with one (docs/planner-latency.md).
    bar = plan.info["step_s"] if fitting else float("inf")  # a candidate replaces a fitting plan only if strictly faster
    if fitting and len(batch) > CANDIDATES_MAX_SAMPLES:
        found = _fastest_reference(plan, batch, cost, beat=bar) if lead >= 1 - CLEAR_LEAD else None
    else:
        clear_lead = fitting and lead < 1 - CLEAR_LEAD and _fastest_reference(plan, batch, cost,
                                                                               beat=bar / (1 - CLEAR_LEAD)) is None
        planned = [] if clear_lead else [Candidate.of(p) for p in baseline_plans(batch, plan.step, plan.config)]
        planned += [Candidate.of(p) for p in uncut_fixed_plans(batch, plan.step, plan.config)]
        found = fastest_fitting([*planned, *sliced_sequence_plans(batch, plan.step, plan.config, first=sliced_first)],
                                cost, beat=bar)
    if fitting and found is None:
        return plan
    if found is None:
        raise no_plan_fits(plan, cost)
    best, best_s = found
    name = best.strategy if best.strategy != "slimpipe" else _sliced_name(best.info)
    cap = best.config.train.micro_batch_cap
    if cap != plan.config.train.micro_batch_cap:
        name += f" ({cap:,}-token micro-batches)"
    info = {"candidate": name, "step_s": best_s, "slimpack": dict(plan.info), name: dict(best.info)}
    return dataclasses.replace(best, strategy=plan.strategy, config=plan.config, info=info)


def reference_candidate(batch: Sequence[Sample], step: int, config) -> Candidate:
    """Best-fit-decreasing's plan of ``batch`` (``BFDPlanner``), the cheapest baseline to plan, as a
    candidate whose pipelines are built as they are asked for, the most tokens first: where it is
    far behind, the fullest replica's simulation gives it up before the other replicas' slices are
    made (most of the 1.1 s the whole plan takes at 2048 GPUs, 133,260 samples). A clear lead is also
    checked against it: SlimPack's own whole-sample packing is scored at the group count its sliced
    plan chose, which can be far from a good one for whole samples. In an out-of-band probe
    (llama2-70b, 8K context, documents of about the context's length, tp4 pp8 vpp2 dp8) SlimPack's
    plan led that packing by 12% while best-fit-decreasing was 3% and Karmarkar-Karp 5% faster."""
    from slimpack.strategies.bfd import BFDPlanner  # the registry imports this package

    planner = BFDPlanner(config)
    packed = planner.pack(batch)
    fullest_first = sorted(range(config.parallel.dp), key=lambda r: (-packed.tokens(r), r))

    def pipelines() -> Iterator[tuple[int, PipelinePlan]]:
        for r in fullest_first:
            yield r, with_default_orders([symmetric_replica(config, r, packed.groups(r))], config)[0]

    def assemble(built: list[PipelinePlan]) -> Plan:
        return Plan(config=config, strategy=planner.name, step=step, samples=tuple(packed.samples),
                    pipelines=tuple(built), info=packed.info)

    return Candidate(pipelines=pipelines, assemble=assemble)


def _fastest_reference(plan: Plan, batch: Sequence[Sample], cost: CostModel, *, beat: float
                       ) -> tuple[Plan, float] | None:
    """``reference_candidate``'s plan and step if it fits and is faster than ``beat``."""
    try:
        return fastest_fitting([reference_candidate(batch, plan.step, plan.config)], cost, beat=beat)
    except ScheduleError:  # under interleaving, a replica whose bins cannot be split into rounds of pp
        return None


def _sliced_name(info: dict) -> str:
    """How a plan report names a slice-level candidate's plan (``sliced_sequence_plans``)."""
    n, spread = info["num_slices"], info["spread"]
    if spread == FIXED_LENGTH:
        return "fixed-length sequences in 1F1B" if n == 1 else f"sliced fixed-length sequences (n={n})"
    if spread == EQUAL_TOKENS:
        return "equal-token sequences in 1F1B" if n == 1 else f"sliced equal-token sequences (n={n})"
    documents = spread == "documents"
    if n == 1:
        return f"bfd sequences by FLOPs ({'documents dealt first' if documents else 'sequences dealt'})"
    return f"sliced bfd sequences (n={n}{', documents dealt first' if documents else ''})"


def no_plan_fits(plan: Plan, cost: CostModel) -> UserError:
    """The error for a batch that no candidate fits: how far over it is and what would help. Where
    the longest sample does not fit even on every replica merged into one context-parallel group
    (DP-Merge's widest), more cp on the same GPUs cannot help, and the error says so; where it
    would not fit at any cp (every cp rank keeps its whole K and V), neither can more GPUs for cp."""
    config = plan.config
    par, train = config.parallel, config.train
    usable = config.cluster.usable_memory_bytes
    need = max(plan_peaks(plan, cost), default=0.0)
    longest = max((s.length for s in plan.samples), default=0)
    widest = par.cp * par.dp
    floor = cost.sample_floor_bytes(longest, cp=widest)
    if floor <= usable:
        why, helps = "", ["raise tp, cp or pp (activations per GPU shrink with each)"]
    else:
        where = f"over all {par.dp} replicas merged (cp {widest})" if par.dp > 1 else f"at cp {widest}"
        why = f"; even {where} that sample needs at least {floor / 2**30:.1f} GiB per GPU"
        least = cost.sample_floor_bytes(longest, cp=math.inf)
        if least > usable:
            why += (f", and at least {least / 2**30:.1f} GiB at any cp (each context-parallel rank keeps "
                    f"its whole K and V)")
            helps = ["raise tp or pp"]
        else:
            helps = ["raise tp or pp, or cp with more GPUs"]
    if train.recompute != "full":
        helps.append("use --recompute full")
    helps.append("or lower --max-context")
    return UserError(
        f"slimpack: no plan of this batch fits in GPU memory with tp {par.tp} pp {par.pp} cp {par.cp} "
        f"(recompute {train.recompute}): the best needs {need / 2**30:.1f} of {usable / 2**30:.1f} GiB "
        f"(longest sample {longest:,} tokens){why}; {', '.join(helps)}")
