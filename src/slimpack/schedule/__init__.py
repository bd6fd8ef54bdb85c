"""Per-stage action orders (schedules) for a pipeline's groups. Pure functions; no torch."""

from slimpack.schedule.builders import (
    Order,
    backward_needs,
    dependency_aware,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    order_to_text,
)
from slimpack.schedule.default import default_order, pipeline_graph

__all__ = ["Order", "backward_needs", "default_order", "dependency_aware", "gpipe", "interleaved_1f1b",
           "one_f_one_b", "order_to_text", "pipeline_graph"]
