"""Memory model: activations kept from forward until backward, and model states per device.

Activations follow the per-tensor accounting of Korthikanti et al., MLSys'23, "Reducing Activation
Recomputation in Large Transformer Models", §4 (34·s·b·h bytes per layer for GPT with dropout and
a 4h GELU MLP), adapted to a Llama-style layer: no dropout masks, RMSNorm, GQA, SwiGLU, and
FlashAttention, which stores the attention output and a float32 log-sum-exp per head instead of the
s² score matrices. Elements kept per token per layer (no recomputation):
  attention-norm input h, QKV input h, Q h, K and V 2·h_kv, attention output h (input of the
  output projection), MLP-norm input h, MLP input h, and the MLP inner tensors: SwiGLU gate, up and
  their product 3·f (GELU: pre- and post-activation 2·f).
Selective recomputation (Korthikanti §5) reruns the core attention in backward so that its s² score
and softmax tensors are not stored; FlashAttention never stores them, so with FA the only tensor
selective recomputation drops is the float32 log-sum-exp: Q, K and V are its checkpointed inputs and
the attention output is still kept as the input of the output projection. Full recomputation keeps
only the layer input (h) and rebuilds the rest in backward.
Sequence parallelism divides everything by tp (Korthikanti §4.2.2); without it the norm inputs and
outputs (4·h) are replicated. Context parallelism divides by cp (each rank holds 1/cp of the tokens),
except K and V: attention all-gathers them over the cp ranks and its backward reads the gathered
K/V, so every cp rank keeps all T tokens' K/V (``runtime.context_parallel``; Llama 3's design).

Model states follow ZeRO (Rajbhandari et al., SC'20) mixed-precision accounting: bf16 parameters
(2 bytes) and bf16 gradients (2 bytes) per parameter, plus 12 bytes of fp32 master weights and Adam
moments, sharded over the data-parallel group (dp·cp ranks) by a distributed optimizer.
Must not import torch.
"""

from __future__ import annotations

from slimpack.config.model import ModelConfig

LSE_BYTES_PER_HEAD = 4
PARAM_BYTES = 2
GRAD_BYTES = 2
OPTIMIZER_BYTES = 12
LOGIT_BYTES = 4  # float32 logits/softmax kept for the cross-entropy backward


def activation_elements_per_token(model: ModelConfig, recompute: str,
                                  layer_ops: str = "slimpack") -> tuple[int, int]:
    """(elements sharded by tp under sequence parallelism, norm elements replicated without it),
    kept per token per layer. transformers' modules (``layer_ops``) keep more than the lean ops:
    each RMSNorm's normalised copy (``weight * normed`` saves it) and the MLP's activation output
    (``act(gate) * up`` saves both factors)."""
    h, f = model.hidden, model.ffn_hidden
    if recompute == "full":
        return h, 0
    mlp_inner = 3 * f if model.ffn_kind == "swiglu" else 2 * f
    norm_side = 4 * h  # two norm inputs and two norm outputs (the QKV and MLP inputs)
    # Q, K, V, the attention output (input of the output projection) and the MLP inner tensors
    tensor_side = 2 * h + 2 * model.kv_hidden + mlp_inner
    if layer_ops == "transformers":
        norm_side += 2 * h
        tensor_side += f
    return tensor_side, norm_side


def gathered_kv_bytes_per_token(model: ModelConfig, *, recompute: str, tp: int) -> float:
    """Bytes of K and V per token per layer (this device's KV heads) that a context-parallel rank
    keeps for every token of the group, not only its own: the all-gathered K/V that attention's
    backward reads. Full recomputation keeps none (it re-gathers them when it rebuilds the layer)."""
    return 0.0 if recompute == "full" else 2 * model.kv_hidden / tp * model.dtype_bytes


def context_parallel_share(bytes_per_token: float, kv_bytes_per_token: float, cp: int) -> float:
    """What one of ``cp`` ranks keeps per token of a group, of ``bytes_per_token`` (cp = 1), whose
    gathered K/V part ``kv_bytes_per_token`` every rank keeps whole and the rest 1/cp."""
    return (bytes_per_token - kv_bytes_per_token) / cp + kv_bytes_per_token


def activation_bytes_per_token(model: ModelConfig, *, recompute: str, tp: int, cp: int,
                               sequence_parallel: bool, layer_ops: str = "slimpack") -> float:
    """Bytes one device keeps per token of a group per layer, from its forward until its backward."""
    tensor_side, norm_side = activation_elements_per_token(model, recompute, layer_ops)
    elements = (tensor_side + norm_side) / tp if sequence_parallel else tensor_side / tp + norm_side
    lse = model.num_heads / tp * LSE_BYTES_PER_HEAD if recompute == "none" else 0
    return context_parallel_share(elements * model.dtype_bytes + lse,
                                  gathered_kv_bytes_per_token(model, recompute=recompute, tp=tp), cp)


def working_bytes_per_token(model: ModelConfig, *, tp: int, cp: int, sequence_parallel: bool,
                            layer_ops: str = "slimpack") -> float:
    """Transient bytes per token while one layer of a group runs (its full activations), on top of
    what is kept: the layer being computed, or rebuilt under recomputation."""
    return activation_bytes_per_token(model, recompute="none", tp=tp, cp=cp,
                                      sequence_parallel=sequence_parallel, layer_ops=layer_ops)


def logits_bytes_per_token(model: ModelConfig, *, tp: int, cp: int) -> float:
    """Bytes of float32 logits per token on the last stage (vocabulary split over tp)."""
    return model.vocab_size / tp * LOGIT_BYTES / cp


def head_input_bytes_per_token(model: ModelConfig, *, tp: int, cp: int, sequence_parallel: bool,
                               layer_ops: str = "slimpack") -> float:
    """Bytes per token kept on the last stage for the final norm's input and the LM head's input
    (its output), sharded by tp under sequence parallelism like the layers' norm tensors; with
    transformers' modules also the final norm's normalised copy."""
    elements = (3 if layer_ops == "transformers" else 2) * model.hidden
    return elements * model.dtype_bytes / (tp if sequence_parallel else 1) / cp


def model_state_bytes(num_params: float, *, shard_ranks: int, distributed_optimizer: bool) -> float:
    """Bytes of parameters, gradients and optimizer states for ``num_params`` held by one device."""
    optimizer = OPTIMIZER_BYTES / shard_ranks if distributed_optimizer else OPTIMIZER_BYTES
    return num_params * (PARAM_BYTES + GRAD_BYTES + optimizer)
