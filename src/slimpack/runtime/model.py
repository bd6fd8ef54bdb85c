"""A Llama-style decoder in plain torch, built from a ``ModelConfig`` and cut into pipeline stages.

Layer: x → RMSNorm → Q, K, V projections (GQA: K and V have ``num_kv_heads`` heads) → RoPE on Q and
K from per-token positions → attention → output projection → residual; → RMSNorm → SwiGLU
(down(silu(gate·x) * up·x)) or GELU (down(gelu(up·x))) → residual. No biases. The first stage owns
the token embedding, the last the final RMSNorm and the LM head (the embedding matrix itself when
``tie_embeddings``).

A block does not run attention itself: ``attention_inputs`` gives Q, K, V and ``finish`` takes the
attention output, so the executor can pack and slice attention across groups (``executor``) and the
reference can run it densely (``reference``).

Initialisation is deterministic per parameter name: the generator of parameter ``name`` is seeded
with (seed, crc32(name)), so a stage built alone gets the same weights as the whole model.
Weights ~ N(0, 1/fan_in) (unit-variance activations, non-trivial attention patterns for tests),
embedding ~ N(0, 1), norm gains = 1.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from slimpack.config import ModelConfig
from slimpack.runtime.ops import apply_rope, rms_norm, silu_gate


class Block(nn.Module):
    """One transformer layer's parameters and its row-wise computations."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, f, kv = config.hidden, config.ffn_hidden, config.kv_hidden
        self.config = config
        self.attn_norm = nn.Parameter(torch.empty(h))
        self.wq = nn.Parameter(torch.empty(h, h))
        self.wk = nn.Parameter(torch.empty(kv, h))
        self.wv = nn.Parameter(torch.empty(kv, h))
        self.wo = nn.Parameter(torch.empty(h, h))
        self.mlp_norm = nn.Parameter(torch.empty(h))
        if config.ffn_kind == "swiglu":
            self.w_gate = nn.Parameter(torch.empty(f, h))
        self.w_up = nn.Parameter(torch.empty(f, h))
        self.w_down = nn.Parameter(torch.empty(h, f))

    def attention_inputs(self, x_te: torch.Tensor, cos_tc: torch.Tensor,
                         sin_tc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q (T, H, D), K and V (T, K, D) after the attention norm, with RoPE on Q and K."""
        cfg = self.config
        a_te = rms_norm(x_te, self.attn_norm)
        num_tokens = x_te.shape[0]
        q_thd = F.linear(a_te, self.wq).view(num_tokens, cfg.num_heads, cfg.head_dim)
        k_tkd = F.linear(a_te, self.wk).view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        v_tkd = F.linear(a_te, self.wv).view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        return apply_rope(q_thd, cos_tc, sin_tc), apply_rope(k_tkd, cos_tc, sin_tc), v_tkd

    def finish(self, x_te: torch.Tensor, attn_thd: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP block, residual: the layer's output (T, E)."""
        h1_te = x_te + F.linear(attn_thd.reshape(x_te.shape), self.wo)
        b_te = rms_norm(h1_te, self.mlp_norm)
        if self.config.ffn_kind == "swiglu":
            inner_tf = silu_gate(F.linear(b_te, self.w_gate), F.linear(b_te, self.w_up))
        else:
            inner_tf = F.gelu(F.linear(b_te, self.w_up))
        return h1_te + F.linear(inner_tf, self.w_down)


class Transformer(nn.Module):
    """The whole decoder; ``stage``/``split`` cut it into pipeline stages that share its parameters."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Parameter(torch.empty(config.vocab_size, config.hidden))
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.final_norm = nn.Parameter(torch.empty(config.hidden))
        self.head = None if config.tie_embeddings else nn.Parameter(torch.empty(config.vocab_size, config.hidden))

    @property
    def head_weight(self) -> nn.Parameter:
        return self.embedding if self.head is None else self.head

    def reset_parameters(self, seed: int) -> None:
        with torch.no_grad():
            for name, param in self.named_parameters():
                rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
                if name.endswith("norm"):
                    param.fill_(1.0)
                    continue
                std = 1.0 if name == "embedding" else param.shape[1] ** -0.5
                values = rng.standard_normal(tuple(param.shape)) * std
                param.copy_(torch.from_numpy(values))

    def stage(self, first_layer: int, end_layer: int) -> ModelStage:
        """The stage holding layers [first_layer, end_layer); embedding if it starts at 0, final norm
        and head if it ends at the last layer."""
        if not 0 <= first_layer <= end_layer <= self.config.num_layers:
            raise ValueError(f"layer range [{first_layer}, {end_layer}) is outside the model's "
                             f"{self.config.num_layers} layers")
        return ModelStage(self, first_layer, end_layer)

    def split(self, num_stages: int, stage_layers: Sequence[int] = ()) -> list[ModelStage]:
        """Consecutive layer ranges: ``stage_layers`` layers each (a config's ``stage_layers``), or
        equal ones when it is empty (``num_layers`` must then divide evenly)."""
        layers = self.config.num_layers
        if stage_layers:
            if len(stage_layers) != num_stages or sum(stage_layers) != layers or min(stage_layers) < 1:
                raise ValueError(f"stage_layers {list(stage_layers)} is not a split of {layers} layers "
                                 f"into {num_stages} stages")
        elif num_stages < 1 or layers % num_stages:
            raise ValueError(f"{layers} layers cannot be split into {num_stages} equal stages")
        else:
            stage_layers = [layers // num_stages] * num_stages
        ends = np.cumsum([0, *stage_layers]).tolist()
        return [self.stage(first, end) for first, end in zip(ends, ends[1:], strict=False)]


class ModelStage(nn.Module):
    """A pipeline stage: a view onto some of a ``Transformer``'s modules (parameters are shared)."""

    def __init__(self, model: Transformer, first_layer: int, end_layer: int) -> None:
        super().__init__()
        self.config = model.config
        self.first_layer, self.end_layer = first_layer, end_layer
        self.has_embedding = first_layer == 0
        self.has_head = end_layer == model.config.num_layers
        self.layers = nn.ModuleList(model.layers[first_layer:end_layer])
        self.embedding = model.embedding if self.has_embedding else None
        self.final_norm = model.final_norm if self.has_head else None
        self.head_weight = model.head_weight if self.has_head else None

    def __repr__(self) -> str:
        parts = ["embedding"] * self.has_embedding + [f"layers {self.first_layer}..{self.end_layer - 1}"]
        return f"ModelStage({', '.join(parts + ['head'] * self.has_head)})"

    def embed(self, ids_t: torch.Tensor) -> torch.Tensor:
        assert self.embedding is not None, "only the first stage embeds tokens"
        return F.embedding(ids_t, self.embedding)

    def logits(self, x_te: torch.Tensor) -> torch.Tensor:
        assert self.final_norm is not None and self.head_weight is not None, "only the last stage has the head"
        return F.linear(rms_norm(x_te, self.final_norm), self.head_weight)


def build_model(config: ModelConfig, *, seed: int = 0, dtype: torch.dtype = torch.float64,
                device: torch.device | str = "cpu") -> Transformer:
    """A ``Transformer`` for ``config`` with deterministic weights from ``seed``."""
    model = Transformer(config).to(device=device, dtype=dtype)
    model.reset_parameters(seed)
    return model
