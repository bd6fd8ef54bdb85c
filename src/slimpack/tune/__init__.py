"""``slimpack tune``: the best layout (tp, pp, vpp, stage split, cp, dp, recomputation) of each
strategy on a GPU budget, found by simulation with memory and time floors pruning the search.
Must not import torch."""

from slimpack.tune.layouts import Layout
from slimpack.tune.search import StrategyTuning, TuneResult, tune
from slimpack.tune.trials import Trial

__all__ = ["Layout", "StrategyTuning", "Trial", "TuneResult", "tune"]
