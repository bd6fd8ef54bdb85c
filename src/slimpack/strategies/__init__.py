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


def make_planner(name: str, config: Config) -> Planner:
    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise UserError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}") from None
    return factory(config)


__all__ = ["STRATEGIES", "Planner", "make_planner"]
