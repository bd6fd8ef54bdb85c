"""``slimpack compare``: run strategies side by side over consecutive steps, tabulate, report. No torch."""

from slimpack.compare.row import StrategyRow
from slimpack.compare.run import Comparison, StepRecord, StrategyRun, Window, compare

__all__ = ["Comparison", "StepRecord", "StrategyRow", "StrategyRun", "Window", "compare"]
