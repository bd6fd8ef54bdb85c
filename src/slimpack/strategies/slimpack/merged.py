"""SlimPack over merged replicas: where memory throttles the pipelines, the batch planned as if the
layout had k times its context parallelism and 1/k of its replicas, each of those pipelines run on
k merged replicas (DP-Merge of the whole batch, k replicas at a time).

DP-Merge (``phase1``) merges replicas for the outliers that one pipeline cannot hold or that would
dominate a replica; the rest of the batch stays on single replicas. When activations fill the GPU
those pipelines hold few groups in flight and serialise: a 70B model at tp 1 over 8 stages leaves
about 19 GiB for activations, and one 8K-token sample keeps about 21 GiB of them at cp 1. On k
merged replicas every group's activations are spread over k times the context-parallel ranks, so
about k times as many groups are in flight (less where the K/V every rank keeps dominates), for the
same device-seconds of compute plus the wider ring's communication. The simulator decides: stress
cell 121 (llama2-70b, tp 1, pp 8, dp 4, 8K context, 128K tokens per GPU) steps in 716 s with
DP-Merge of outliers only, 659 s with the replicas merged in pairs, 138 s with all four merged.
Must not import torch.
"""

from __future__ import annotations

import dataclasses

from slimpack.config import Config
from slimpack.plan.types import Plan


def throttled(plan: Plan) -> bool:
    """Whether memory held a pipeline below 1F1B's warm-up: its first stage runs fewer forwards
    before its first backward than pp (or its group count, if smaller). Planning the batch again
    on merged replicas costs a plan per width, so it is tried only then (stress cell 121: one
    forward in flight where 1F1B keeps eight; the matrix's tp8 pp4 layout at 128K: 11 or more)."""
    pp = plan.config.parallel.pp
    for pipe in plan.pipelines:
        assert pipe.order is not None  # a Plan carries its orders
        ahead = next((i for i, action in enumerate(pipe.order[0]) if action.kind == "B"), len(pipe.order[0]))
        if ahead < min(pp, len(pipe.forward)):
            return True
    return False


def merge_widths(dp: int) -> list[int]:
    """The merge widths tried, narrowest first: the powers of two that divide ``dp`` (above 1)."""
    return [k for k in (2**e for e in range(1, dp.bit_length())) if dp % k == 0]


def widened(config: Config, k: int) -> Config:
    """``config`` with k times the context parallelism and 1/k of the replicas (same GPUs)."""
    par = config.parallel
    return dataclasses.replace(config, parallel=dataclasses.replace(par, cp=par.cp * k, dp=par.dp // k))


def on_merged_replicas(plan: Plan, config: Config, k: int) -> Plan:
    """A plan of ``widened(config, k)`` as a plan of ``config``: replica r of the widened layout is
    replicas r·k .. r·k+k-1 merged (each pipeline keeps its groups, order and cp)."""
    pipelines = tuple(dataclasses.replace(pipe, replicas=tuple(r * k + i for r in pipe.replicas for i in range(k)))
                      for pipe in plan.pipelines)
    return dataclasses.replace(plan, config=config, pipelines=pipelines)
