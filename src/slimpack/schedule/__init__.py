"""Per-stage action orders (schedules) for a pipeline's groups, their one lowering into receive /
compute / send steps, and their dependency graph. Pure functions of values; imports neither
``slimpack.plan`` (which sits above it) nor torch."""

from slimpack.schedule.actions import Action, Order
from slimpack.schedule.builders import (
    backward_needs,
    chain_lookahead,
    dependency_aware,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    order_to_text,
    slice_1f1b,
)
from slimpack.schedule.default import default_order
from slimpack.schedule.lowering import Step, Transfer, lower, lower_action, walk

__all__ = ["Action", "Order", "Step", "Transfer", "backward_needs", "chain_lookahead", "default_order", "dependency_aware", "gpipe",
           "interleaved_1f1b", "lower", "lower_action", "one_f_one_b", "order_to_text", "slice_1f1b", "walk"]
