"""``slimpack compare``: run strategies side by side over consecutive steps, tabulate, report. No torch."""

from slimpack.compare.run import Comparison, StepRecord, StrategyRun, compare, step_batches

__all__ = ["Comparison", "StepRecord", "StrategyRun", "compare", "step_batches"]
