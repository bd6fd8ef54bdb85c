"""The PyTorch runtime: executes a Plan with exact gradients (the only part of slimpack that imports torch).

Modules, read top to bottom:

- ``ops``: custom autograd functions (RMSNorm, RoPE, SiLU-gate) that keep exactly the tensors the
  memory model counts;
- ``attention``: ``varlen_attention``, sliced variable-length causal attention with backends;
- ``model``: a Llama-style decoder built from a ``ModelConfig``, cut into stages by layer ranges;
- ``hf_model``: transformers' own decoder models from a ``config.json`` as stages (optional, imports
  transformers); ``models`` picks the home-made or the HF model; ``precision``: bf16 compute with
  float32 master weights and gradients;
- ``loss``: token-level LM targets and the globally normalised cross-entropy;
- ``executor``: ``StageExecutor``, which runs F/B actions of a pipeline's groups on one stage, one
  autograd graph per cell (``slimpack.plan.cells``);
- ``pipeline``: single-process drivers that run every stage of a pipeline;
- ``memory``: counts the activation bytes kept for backward;
- ``reference``: the ordinary, unsliced, unpacked computation that the executor must reproduce;
- ``verify``: runs a Plan both ways and compares the loss and every gradient.

Shape suffixes on tensors (DESIGN.md §4): T tokens (packed), H query heads, K key/value heads,
D head dim, E model width (hidden), F MLP width, V vocabulary, N segments.
"""

from slimpack.errors import ScheduleError
from slimpack.runtime.attention import available_backends, varlen_attention
from slimpack.runtime.executor import StageExecutor
from slimpack.runtime.loss import count_loss_tokens
from slimpack.runtime.memory import ActivationTracker
from slimpack.runtime.model import ModelStage, Transformer, build_model
from slimpack.runtime.pipeline import build_executors, run_in_order, run_stage_orders
from slimpack.runtime.reference import reference_loss
from slimpack.runtime.verify import VerifyResult, random_tokens, verify_plan

__all__ = [
    "ActivationTracker", "ModelStage", "ScheduleError", "StageExecutor", "Transformer", "VerifyResult",
    "available_backends", "build_executors", "build_model", "count_loss_tokens", "random_tokens",
    "reference_loss", "run_in_order", "run_stage_orders", "varlen_attention", "verify_plan",
]
