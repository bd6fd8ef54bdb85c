"""The one cost model (FLOPs, time, memory, communication) and its calibration. No torch."""

from slimpack.cost.flops import (
    attention_pairs,
    layer_backward_flops,
    layer_forward_flops,
    model_training_flops,
)
from slimpack.cost.model import ChunkShape, CostModel

__all__ = ["ChunkShape", "CostModel", "attention_pairs", "layer_backward_flops", "layer_forward_flops",
           "model_training_flops"]
