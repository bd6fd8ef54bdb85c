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
    and a replica has that many tokens. At short contexts a baseline packing several sequences per
    micro-batch ran up to 2.3x faster than with one (``docs/baseline-caps.md``); at long ones memory
    leaves no room above the context."""
    train = config.train
    most = min(memory_token_cap(CostModel(config)), train.global_batch_tokens // config.parallel.dp)
    caps = [train.micro_batch_cap]
    cap = 2 * train.max_context
    while cap <= most:
        if cap > train.micro_batch_cap:
            caps.append(cap)
        cap *= 2
    return caps
