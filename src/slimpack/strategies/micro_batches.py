"""How many tokens a baseline's micro-batch may hold: what plain 1F1B's memory allows, and the caps
worth trying (``TrainConfig.micro_batch_tokens``).
Must not import torch.
"""

from __future__ import annotations

import math

from slimpack.config import Config
from slimpack.cost import CostModel


def memory_token_cap(cost: CostModel) -> int:
    """Most tokens a micro-batch may hold so that plain 1F1B fits in memory: stage s keeps the
    activations of pp - s micro-batches (all its model chunks) plus one layer's working set, on top
    of its model states."""
    config = cost.config
    pp, chunks = config.parallel.pp, config.parallel.virtual_stages
    cap = math.inf
    for stage in range(pp):
        kept = sum(cost.activation_bytes(1.0, virtual_stage=c * pp + stage) for c in range(chunks))
        per_token = (pp - stage) * kept + cost.working_bytes(1.0)
        cap = min(cap, (config.cluster.usable_memory_bytes - cost.model_state_bytes(stage)) / per_token)
    return max(0, int(cap))


def micro_batch_caps(config: Config) -> list[int]:
    """The micro-batch token caps worth trying for a baseline (SlimPack's candidates, ``tune``'s
    search): the config's, then doubling from twice the context while plain 1F1B's memory allows it
    and a replica has that many tokens, and one doubling beyond memory's bound where it allowed at
    least one. At short contexts a baseline packing several sequences per micro-batch ran up to 2.3x
    faster than with one (``docs/baseline-caps.md``); at long ones memory seldom leaves room above
    the context (in the 256-GPU tune tables at 128K and 256K, only with full recomputation).

    The bound assumes full micro-batches, and whole-document packers rarely fill theirs. In the
    baseline-caps sweep (``docs/baseline-caps.md``) a baseline's best cap lay past the bound in 7 of 260
    cells: one doubling past, 0.1-0.8% faster than within it, in the 6 where the bound had allowed a
    doubling; two doublings past in one where it had allowed none (stress cell 190, where SlimPack's
    own plan is faster still). Trying one more cap only where the bound allowed a doubling keeps the
    long contexts (whose candidate steps decide the planner's latency) at one cap. A plan whose
    micro-batches do not fit is found out by the exact memory check like any other."""
    train = config.train
    per_replica = train.global_batch_tokens // config.parallel.dp
    most = min(memory_token_cap(CostModel(config)), per_replica)
    caps = [train.micro_batch_cap]
    cap = 2 * train.max_context
    while cap <= most:
        if cap > train.micro_batch_cap:
            caps.append(cap)
        cap *= 2
    if cap > 2 * train.max_context and cap <= per_replica and cap > train.micro_batch_cap:
        caps.append(cap)  # one past memory's bound, where the bound allowed a doubling
    return caps
