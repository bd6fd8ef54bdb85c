"""The configs commands start from when no ``--config`` is given (flags override them).

Planning commands (``compare``, ``plan``, ``cost``) share one layout, the demo's: Llama-2-7B on 64
H100s as tp 8 x pp 4 x dp 2 (WLB-LLM's 7B layout), 128K context, 4M-token global batches; it fits
every strategy in memory. Runtime commands (``train``, ``fidelity``, ``calibrate``) run the tiny
model on this machine's CPU. Every command's ``--help`` shows the values it starts from.
"""

from __future__ import annotations

from slimpack.config.config import build_config
from slimpack.config.parallel import ParallelConfig
from slimpack.config.train import TrainConfig

PLANNING_CONFIG = build_config(model="llama2-7b", gpu="h100-sxm", parallel=ParallelConfig(tp=8, pp=4, dp=2),
                               train=TrainConfig(max_context=131072, global_batch_tokens=4 * 2**20))
"""Where ``compare``, ``plan`` and ``cost`` start."""

RUNTIME_TRAIN = TrainConfig(max_context=1024, global_batch_tokens=8192, recompute="none")
"""A CPU-sized training setting: 1K context, 8K-token batches, no recomputation."""

RUNTIME_CONFIG = build_config(model="tiny", train=RUNTIME_TRAIN)
"""Where ``train`` and ``fidelity`` start: the tiny model on one process (tp = pp = dp = 1)."""

CALIBRATION_CONFIG = build_config(
    model="tiny", train=TrainConfig(max_context=2048, global_batch_tokens=8192, recompute="none"))
"""Where ``calibrate`` starts: the tiny model, groups up to 2K tokens timed."""

PRECISIONS = ("full", "bf16")
"""Runtime precision: ``full`` computes in the model's dtype; ``bf16`` computes in bf16 with float32
master weights and gradients (``runtime.precision``)."""
