"""FLOP counts of a Llama-style layer for a slice of ``c`` tokens with ``p`` earlier tokens of its sample.

Conventions (multiply-add = 2 FLOPs; Narayanan et al., SC'21, "Efficient Large-Scale Language Model
Training on GPU Clusters", eq. 2, generalised to GQA and SwiGLU):
- linear parts per token: QKV projection 2·h·(h + 2·h_kv), output projection 2·h², MLP 2·k·h·f with
  k = 3 matrices for SwiGLU, 2 for GELU;
- causal attention with a prefix: query t of the slice sees keys 0..p+t, so the slice has
  ``pairs = c·p + c(c+1)/2`` (query, key) pairs; QKᵀ and softmax·V cost 2·h FLOPs per pair each, so
  forward attention = 4·h·pairs (GQA shares K/V between heads but not the dot products);
- backward = 2x forward for GEMMs (grad wrt input and wrt weight) and 2.5x for attention
  (FlashAttention recomputes QKᵀ in its backward; Dao, 2023, FlashAttention-2 §3.1.2).
Memory-bound per-token work is counted in bytes of HBM traffic (``elementwise_bytes_per_token``).
Must not import torch.
"""

from __future__ import annotations

from slimpack.config.model import ModelConfig

GEMM_BACKWARD_FACTOR = 2.0
ATTENTION_BACKWARD_FACTOR = 2.5


def attention_pairs(tokens: int, prefix: int) -> int:
    """Causal (query, key) pairs of a slice of ``tokens`` queries after ``prefix`` earlier tokens."""
    return tokens * prefix + tokens * (tokens + 1) // 2


def linear_flops_per_token(model: ModelConfig) -> int:
    """Forward FLOPs of the linear parts of one layer, per token."""
    h = model.hidden
    qkv = 2 * h * (h + 2 * model.kv_hidden)
    out = 2 * h * h
    mlp = 2 * model.num_ffn_matrices * h * model.ffn_hidden
    return qkv + out + mlp


def attention_flops_per_pair(model: ModelConfig) -> int:
    """Forward FLOPs of causal attention per (query, key) pair: QKᵀ and softmax·V, 2·h each."""
    return 4 * model.hidden


def lm_head_flops_per_token(model: ModelConfig) -> int:
    """Forward FLOPs of the LM head (logits) per token."""
    return 2 * model.hidden * model.vocab_size


def elementwise_elements_per_token(model: ModelConfig) -> int:
    """Elements one layer's memory-bound kernels read and write per token in forward: two RMSNorms
    (read h, write h each), RoPE on Q and K (read and write h + h_kv), the SwiGLU gate (read gate and
    up, write their product: 3·f; GELU reads and writes f: 2·f) and two residual adds (read 2·h,
    write h each). Backward moves about twice as much (gradients in and out plus the saved inputs)."""
    h = model.hidden
    norms = 2 * 2 * h
    rope = 2 * (h + model.kv_hidden)
    gate = 3 * model.ffn_hidden if model.ffn_kind == "swiglu" else 2 * model.ffn_hidden
    residuals = 2 * 3 * h
    return norms + rope + gate + residuals


ELEMENTWISE_BACKWARD_FACTOR = 2.0


def layer_forward_flops(model: ModelConfig, tokens: int, prefix: int = 0) -> int:
    """Forward FLOPs of one layer for a slice (linear + attention)."""
    return (linear_flops_per_token(model) * tokens
            + attention_flops_per_pair(model) * attention_pairs(tokens, prefix))


def layer_backward_flops(model: ModelConfig, tokens: int, prefix: int = 0, *, recompute: str = "none") -> float:
    """Backward FLOPs of one layer, including the forward work that recomputation repeats."""
    linear = linear_flops_per_token(model) * tokens
    attention = attention_flops_per_pair(model) * attention_pairs(tokens, prefix)
    flops = GEMM_BACKWARD_FACTOR * linear + ATTENTION_BACKWARD_FACTOR * attention
    if recompute == "full":
        flops += linear + attention
    elif recompute == "selective":
        flops += attention
    return flops


def model_training_flops(model: ModelConfig, length):
    """Model FLOPs of one training pass (forward + backward, no recomputation) of a whole sample,
    LM head included: the numerator of MFU. For large models this is ~6·N·D + attention.
    ``length`` may be a numpy array of lengths (one value per sample)."""
    pairs = length * (length + 1) / 2  # attention_pairs(length, 0), in float so arrays do not overflow
    layers = model.num_layers * (3.0 * linear_flops_per_token(model) * length
                                 + 3.5 * attention_flops_per_pair(model) * pairs)
    head = 3.0 * lm_head_flops_per_token(model) * length
    return layers + head
