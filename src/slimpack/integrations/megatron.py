"""Megatron-Core adapter: a slimpack plan as the per-rank sample schedule of Megatron-Core's hybrid
context parallelism (megatron-core 0.16.1, read from its source; nothing here imports it).

What Megatron-Core expects (``megatron/core/pipeline_parallel/hybrid_cp_schedule.py`` and
``megatron/core/datasets/data_schedule.py``, 0.16.1). With ``hybrid_context_parallel=True`` the
data loader wrapper ``HybridCPDataLoaderWrapper`` gathers every sub-sample length of the global
batch across the data-parallel group as ``(global_id, seqlen)`` pairs and asks its scheduler
(``BalancedCPScheduler.get_groups_and_subsamples(sample_id_seqlens, config)``) for
``(groups, sample_id_groups)``: ``sample_id_groups[j][r]`` lists the global ids that rank ``r`` of
the DPxCP group runs in round ``j`` (rounds are separated by a barrier); a sample listed by ``k``
ranks of one round runs with context parallelism over those ``k`` ranks (``local_cp_size = k``),
which must be one of the process groups Megatron builds: a power-of-two, aligned block of ranks.
``groups[j][r]`` lists the same samples' lengths. Each listed sample then runs its own forward and
backward in ``forward_backward_no_pipelining``: this path has no pipeline parallelism.

:class:`SlimpackCPScheduler` offers the same ``get_groups_and_subsamples`` method, backed by a
slimpack planner; :func:`sample_id_groups` turns any plan into that structure.

Ranks may run different numbers of samples: ``hybrid_context_parallel_forward_backward`` loops over
each rank's own samples of a round (none is allowed) and ends every round with a barrier, and each
rank runs the last sample of its last round outside ``no_sync`` (the gradient all-reduce), so the
last round must list a sample on every rank. Hence no padding micro-batches here
(``rank_micro_batches`` pads for frameworks with a fixed count): shorter pipelines start later.

What Megatron-Core cannot express, so the plan must be whole-sample and pp = 1 here:
- **slices**: a sample is the unit of a forward/backward; there is no dependency between parts of
  one sample across micro-batches (slimpack's slices carry K/V forward and dK/dV backward);
- **asymmetric backward**: each sample's backward follows its forward at once;
- **DP-Merge with pipelining**: hybrid CP runs only in the no-pipelining schedule; merged replicas
  (CP groups) are expressible at pp = 1 only, and only as power-of-two aligned rank blocks.

Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slimpack.config import Config
from slimpack.errors import UserError
from slimpack.integrations.wholesample import require_whole_sample, whole_sample_config
from slimpack.plan.types import Plan, Sample
from slimpack.strategies import make_planner

SampleIdGroups = list[list[list[int]]]
"""Round -> DPxCP rank -> global sample ids (Megatron-Core's ``sample_id_groups``)."""
FRAMEWORK = "Megatron-Core"


def sample_id_groups(plan: Plan, *, lower: bool = False) -> SampleIdGroups:
    """The plan's step as Megatron-Core's ``sample_id_groups`` over the DPxCP ranks
    (``dp * cp`` of them; rank ``replica * cp + c``, context-parallel ranks innermost as in
    Megatron's default ``tp-cp-ep-dp-pp`` order). Pipelines with fewer groups than others start
    later (empty leading rounds), so every rank runs at least one sample in the last round.
    """
    par = plan.config.parallel
    if par.pp != 1 or par.virtual_stages != 1:
        raise UserError(f"{FRAMEWORK}'s hybrid context parallelism runs without pipeline parallelism; "
                        f"this plan has pp={par.pp} (virtual stages {par.virtual_stages})")
    plan = require_whole_sample(plan, lower=lower, framework=FRAMEWORK)
    num_ranks = par.dp * par.cp
    rounds = max(len(pipe.forward) for pipe in plan.pipelines)
    out: SampleIdGroups = [[[] for _ in range(num_ranks)] for _ in range(rounds)]
    for pipe in plan.pipelines:
        ranks = [replica * par.cp + c for replica in pipe.replicas for c in range(par.cp)]
        _check_cp_block(ranks)
        first_round = rounds - len(pipe.forward)
        for j, group in enumerate(pipe.forward):
            for rank in ranks:
                out[first_round + j][rank].extend(s.sample_id for s in group)
    return out


def _check_cp_block(ranks: list[int]) -> None:
    size = len(ranks)
    contiguous = ranks == list(range(ranks[0], ranks[0] + size))
    if size & (size - 1) or not contiguous or ranks[0] % size:
        raise UserError(f"{FRAMEWORK} runs context parallelism on power-of-two aligned rank blocks; "
                        f"a pipeline spans DPxCP ranks {ranks}")


class SlimpackCPScheduler:
    """Drop-in for Megatron-Core's ``BalancedCPScheduler``: plans the gathered sub-samples with a
    slimpack strategy (whole-sample form, pp = 1, MILP off so that every rank computes the same plan
    independently) and returns ``(groups, sample_id_groups)``.

    ``config`` describes the DPxCP group (``dp`` and ``cp`` of its parallel layout; pp must be 1).
    Wire it in after building the wrapper: ``wrapper.cp_balancing_scheduler = SlimpackCPScheduler(cfg)``.
    """

    def __init__(self, config: Config, strategy: str = "slimpack") -> None:
        if config.parallel.pp != 1:
            raise UserError(f"{FRAMEWORK}'s hybrid context parallelism needs pp=1, got pp={config.parallel.pp}")
        self.config = whole_sample_config(config, dp_merge=True)
        self.strategy = strategy
        self.step = 0

    def get_groups_and_subsamples(self, sample_id_seqlens: Sequence[tuple[int, int]], config: Any = None
                                  ) -> tuple[list[list[list[int]]], SampleIdGroups]:
        """``config`` (Megatron's) is accepted for the interface and not read."""
        del config
        lengths = {int(gid): int(seqlen) for gid, seqlen in sample_id_seqlens}
        batch = [Sample(id=gid, length=length) for gid, length in lengths.items()]
        plan = make_planner(self.strategy, self.config).plan(batch, step=self.step)
        self.step += 1
        if plan.deferred:  # Megatron runs the whole gathered batch now: nothing may wait
            raise UserError(f"strategy {self.strategy!r} deferred samples {list(plan.deferred)}; "
                            f"use a strategy that schedules every sample")
        ids = sample_id_groups(plan)
        groups = [[[lengths[gid] for gid in rank] for rank in round_] for round_ in ids]
        return groups, ids


__all__ = ["SampleIdGroups", "SlimpackCPScheduler", "sample_id_groups"]
