"""Planning strategies: SlimPack and the baselines, each returning a Plan. No torch.

``STRATEGIES`` maps a ``--strategy`` name to a factory ``Config -> Planner``.
"""

from __future__ import annotations

from slimpack.config import Config
from slimpack.errors import UserError
from slimpack.strategies.base import Planner, PlannerFactory
from slimpack.strategies.bfd import BFDPlanner
from slimpack.strategies.bytescale import ByteScalePlanner
from slimpack.strategies.fixed import FixedPlanner
from slimpack.strategies.kk import KKPlanner
from slimpack.strategies.slimpack import SlimPackPlanner
from slimpack.strategies.slimpipe import SlimPipePlanner
from slimpack.strategies.wlb import WLBPlanner

STRATEGIES: dict[str, PlannerFactory] = {
    "fixed": FixedPlanner,
    "slimpack": SlimPackPlanner,
    "bfd": BFDPlanner,
    "kk": KKPlanner,
    "wlb": WLBPlanner,
    "slimpipe": SlimPipePlanner,
    "bytescale": ByteScalePlanner,
}

CUTS_DOCUMENTS = frozenset({"fixed", "slimpipe"})
"""Strategies that run fixed-length sequences and so cut documents at sequence boundaries: a piece
cut off does not attend to its document's earlier tokens. On the same tokens they compute less
attention than unpacked training and train a different objective; the others keep every document
whole (SlimPack's slices attend to all the earlier tokens of their document)."""


def make_planner(name: str, config: Config) -> Planner:
    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise UserError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}") from None
    return factory(config)


DEFERS_SAMPLES = frozenset({"wlb"})
"""Strategies that hold samples back from step to step (WLB-LLM's outlier queues): a run of a few
steps ends with a drain of what they still hold, which a longer run spreads over more steps."""

MICRO_BATCH_CAPPED = frozenset({"fixed", "bfd", "kk", "wlb", "bytescale"})
"""Strategies whose micro-batches hold at most ``TrainConfig.micro_batch_cap`` tokens (SlimPipe
slices context-length sequences, SlimPack sizes its groups by cost and memory)."""


__all__ = ["CUTS_DOCUMENTS", "DEFERS_SAMPLES", "MICRO_BATCH_CAPPED", "STRATEGIES", "Planner", "make_planner"]
