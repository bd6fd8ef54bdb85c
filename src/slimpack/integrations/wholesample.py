"""The whole-sample form of a plan, and each data-parallel rank's micro-batches in it.

Frameworks that pack variable-length samples (Hugging Face/TRL padding-free batches, Megatron-Core's
packed sequences) run each sample whole inside one micro-batch, forward and backward alike. What
they can take from a slimpack plan is therefore its *whole-sample form*: no slices, backward groups
equal to forward groups. A plan planned that way (``use_slicing=False, use_asymmetric=False``) is
already in that form; any other plan can be *lowered* to it: each sample runs whole in the forward
group that held its first slice, and groups left empty vanish. Lowering keeps the assignment of
samples to replicas and the group order, but loses what slicing and regrouping bought (measure it
with the simulator: :func:`slimpack.sim.simulate` scores the lowered plan as any other).

Must not import torch.
"""

from __future__ import annotations

import dataclasses

from slimpack.config import Config
from slimpack.errors import UserError
from slimpack.plan.types import Group, PipelinePlan, Plan, Slice

MicroBatches = tuple[tuple[int, ...], ...]
"""One rank's micro-batches of one step, each a tuple of sample ids in packing order."""


def whole_sample_config(config: Config, *, dp_merge: bool = False) -> Config:
    """``config`` with the planner switched to whole samples (no slicing, no asymmetric backward),
    DP-Merge only where the framework runs context parallelism across replicas, and the MILP off:
    its result depends on a wall-clock limit, and every rank must compute the same plan."""
    planner = dataclasses.replace(config.planner, use_slicing=False, use_asymmetric=False,
                                  use_dp_merge=dp_merge and config.planner.use_dp_merge, use_milp=False)
    return dataclasses.replace(config, planner=planner)


def is_whole_sample(plan: Plan) -> bool:
    """True when every slice is a whole sample and every pipeline's backward groups equal its
    forward groups."""
    lengths = plan.sample_lengths()
    return all(pipe.symmetric and all(s.start == 0 and s.end == lengths[s.sample_id]
                                      for group in pipe.forward for s in group)
               for pipe in plan.pipelines)


def whole_sample_form(plan: Plan) -> Plan:
    """``plan`` lowered to whole samples (see the module doc); a plan already in that form is
    returned unchanged. The lowered plan runs the default schedule for its groups."""
    if is_whole_sample(plan):
        return plan
    lengths = plan.sample_lengths()
    pipelines = []
    for pipe in plan.pipelines:
        groups: list[Group] = []
        for group in pipe.forward:
            whole = tuple(Slice(s.sample_id, 0, lengths[s.sample_id]) for s in group if s.start == 0)
            if whole:
                groups.append(whole)
        pipelines.append(PipelinePlan(replicas=pipe.replicas, cp=pipe.cp, forward=tuple(groups),
                                      backward=tuple(groups)))
    info = {"whole_sample_form_of": plan.strategy,
            "forward_groups_before": sum(len(p.forward) for p in plan.pipelines)}
    return dataclasses.replace(plan, pipelines=tuple(pipelines), info=info)


def require_whole_sample(plan: Plan, *, lower: bool, framework: str) -> Plan:
    """The plan a framework can run: ``plan`` itself when it is whole-sample, its lowered form when
    ``lower``, else a :class:`UserError` that says why and what to do."""
    if is_whole_sample(plan):
        return plan
    if lower:
        return whole_sample_form(plan)
    raise UserError(f"{framework} runs whole samples, but this {plan.strategy} plan (step {plan.step}) "
                    f"has slices or asymmetric backward groups; plan with use_slicing=False and "
                    f"use_asymmetric=False, or ask for its whole-sample form (lower=True)")


def equal_count_form(plan: Plan, *, lower: bool = False, framework: str = "data parallelism") -> Plan:
    """The plan as a framework with plain data parallelism and a fixed number of micro-batches per
    step runs it: whole-sample form (lowered when ``lower``), every replica on its own samples, its
    groups unchanged. The simulator scores it as any other plan.

    Replicas merged into one context-parallel group (DP-Merge) are refused: plain data parallelism
    runs every replica on its own samples. The frameworks run the same number of micro-batches
    (gradient-accumulation steps) on every rank: :func:`rank_micro_batches` fills a replica that
    holds fewer groups than the most any replica holds with *padding micro-batches*. They are not
    in this plan (the simulator has no empty group); each is a one-token forward and backward with
    no loss, negligible next to the real micro-batches, so this plan's simulated time stands for
    the padded run. Groups are never merged to equalise counts (two long documents merged into
    one micro-batch need not fit in memory) nor split (halves of unequal size made 1F1B's step
    longer on net in the simulator: benchmarks/integrations_gain.py, docs/integrations.md).
    """
    plan = require_whole_sample(plan, lower=lower, framework=framework)
    merged = next((p for p in plan.pipelines if len(p.replicas) > 1), None)
    if merged is not None:
        raise UserError(f"{framework} cannot run replicas {list(merged.replicas)} merged into one "
                        f"context-parallel group (DP-Merge); plan with use_dp_merge=False")
    return plan


def rank_micro_batches(plan: Plan, *, lower: bool = False, framework: str = "data parallelism"
                       ) -> list[MicroBatches]:
    """Per data-parallel replica (index = replica), its micro-batches of this plan's step in
    :func:`equal_count_form`, every replica with the same number of micro-batches: the most groups
    any replica holds. A replica with fewer groups ends with *padding micro-batches*, empty tuples
    (no sample), one per missing micro-batch: a loader turns each into a one-token row whose label
    is ignored (``slimpack.integrations.hf.packed_batch``), so every rank runs the same number of
    forward/backward calls and the gradient is unchanged."""
    form = equal_count_form(plan, lower=lower, framework=framework)
    count = max(len(pipe.forward) for pipe in form.pipelines)
    per_replica: dict[int, MicroBatches] = {
        pipe.replicas[0]: tuple(tuple(s.sample_id for s in group) for group in pipe.forward)
        for pipe in form.pipelines}
    assert sorted(per_replica) == list(range(plan.config.parallel.dp)), "the checker guarantees one pipeline per replica"
    return [per_replica[r] + ((),) * (count - len(per_replica[r])) for r in range(plan.config.parallel.dp)]


__all__ = ["MicroBatches", "equal_count_form", "is_whole_sample", "rank_micro_batches", "require_whole_sample",
           "whole_sample_config", "whole_sample_form"]
