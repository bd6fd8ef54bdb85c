"""Parameters of the time model: how close to peak each kind of op runs, as a function of size.

An op of F FLOPs over n tokens takes ``F / (peak * e_max * n / (n + n_half)) + overhead``
(a saturating efficiency curve: small slices run below peak). Rewritten, time is linear in the
unknowns: ``F * a + (F / n) * b`` with ``a = 1/(peak*e_max)`` and ``b = n_half/(peak*e_max)``, which is
what calibration fits by least squares. Memory-bound per-token work (norms, RoPE, SwiGLU, residual
adds) is charged separately at a fraction of HBM bandwidth.

Presets are named by attention-kernel family (``EFFICIENCY_PRESETS``); the figures are for H100
SXM in bf16 and are replaced by ``slimpack calibrate`` measurements:

- ``fa3`` (the default; FlashAttention-3, or cuDNN fused attention as Transformer Engine runs it):
  forward 0.60 of peak (Shah et al., 2024, "FlashAttention-3", Fig. 5: ~600-660 TFLOP/s causal,
  head dim 128, bf16, long sequences), backward 0.45 (same paper, Fig. 6: ~450-500 TFLOP/s; its
  backward is 1.5-1.75x FlashAttention-2's).
- ``fa2`` (FlashAttention-2 on Hopper): forward 0.35 (FlashAttention-3 paper, §1: "FlashAttention-2
  achieves only 35% utilization on the H100"), backward 0.30 (FA2's backward reaches ~85% of its
  forward's throughput on A100: Dao, 2023, FlashAttention-2, §4.1, 63% vs 73% of peak).
- GEMMs 0.75 of peak for large bf16 matrices in both (cuBLAS on H100 reaches ~700-750 TFLOP/s on
  the 4K-16K shapes of 7B-70B layers; Megatron-Core reports ~0.5-0.55 MFU end to end).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from slimpack.config.base import ConfigBase, require
from slimpack.errors import UserError


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencyConfig(ConfigBase):
    kernels: str = "fa3"
    """Label of the figures: the attention-kernel family of a preset (``fa2``, ``fa3``), or
    ``calibrated``. Informational: the report prints it with the figures below."""
    gemm_max: float = 0.75
    """Fraction of peak reached by large GEMMs (QKV, output, MLP, LM head)."""
    gemm_half_tokens: float = 256.0
    """Tokens in a call at which GEMMs reach half of ``gemm_max``."""
    attention_max: float = 0.60
    """Fraction of peak reached by large causal attention forward."""
    attention_backward_max: float = 0.45
    """Fraction of peak reached by large causal attention backward (its FLOPs are 2.5x forward's)."""
    attention_half_tokens: float = 512.0
    """Query tokens of one slice at which attention reaches half of its maximum."""
    elementwise_bandwidth: float | None = 0.7
    """Fraction of HBM bandwidth reached by the memory-bound per-token kernels (RMSNorm, RoPE,
    SwiGLU, residual adds; see ``cost.flops.elementwise_bytes_per_token``); None: not charged."""
    layer_overhead_s: float = 40e-6
    """Fixed time per layer per forward (kernel launches; backward pays twice as many)."""

    def __post_init__(self) -> None:
        for name in ("gemm_max", "attention_max", "attention_backward_max"):
            value = getattr(self, name)
            require(0 < value <= 1, f"{name} must be in (0, 1], got {value}")
        require(self.elementwise_bandwidth is None or 0 < self.elementwise_bandwidth <= 1,
                f"elementwise_bandwidth must be in (0, 1] or null, got {self.elementwise_bandwidth}")
        require(self.gemm_half_tokens >= 0 and self.attention_half_tokens >= 0,
                "half-efficiency sizes must be >= 0")
        require(self.layer_overhead_s >= 0, f"layer_overhead_s must be >= 0, got {self.layer_overhead_s}")

    def assumptions(self) -> str:
        """One line naming every figure, for report title blocks."""
        elementwise = ("not charged" if self.elementwise_bandwidth is None
                       else f"{self.elementwise_bandwidth:.2f} of HBM bandwidth")
        return (f"{self.kernels} kernels: GEMM {self.gemm_max:.2f} of peak (half at {self.gemm_half_tokens:.0f} "
                f"tokens), attention forward {self.attention_max:.2f} / backward {self.attention_backward_max:.2f} "
                f"(half at {self.attention_half_tokens:.0f} query tokens), elementwise {elementwise}, "
                f"{self.layer_overhead_s * 1e6:.0f} us per layer")


EFFICIENCY_PRESETS: dict[str, EfficiencyConfig] = {
    "fa3": EfficiencyConfig(),
    "fa2": EfficiencyConfig(kernels="fa2", attention_max=0.35, attention_backward_max=0.30),
}


def efficiency_preset(name: str) -> EfficiencyConfig:
    try:
        return EFFICIENCY_PRESETS[name]
    except KeyError:
        raise UserError(f"unknown kernel family {name!r}; valid: {', '.join(sorted(EFFICIENCY_PRESETS))}") from None


def with_attention_scale(eff: EfficiencyConfig, scale: float) -> EfficiencyConfig:
    """``eff`` with forward and backward attention efficiency both divided by ``scale`` (calibration
    measures one attention speed and keeps the preset's backward-to-forward ratio)."""
    return dataclasses.replace(eff, attention_max=min(1.0, eff.attention_max / scale),
                               attention_backward_max=min(1.0, eff.attention_backward_max / scale))
