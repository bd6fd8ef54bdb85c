"""A Llama-style decoder in plain torch, built from a ``ModelConfig`` and cut into pipeline stages.

Layer: x → RMSNorm → Q, K, V projections (GQA: K and V have ``num_kv_heads`` heads) → RoPE on Q and
K from per-token positions → attention → output projection → residual; → RMSNorm → SwiGLU
(down(silu(gate·x) * up·x)) or GELU (down(gelu(up·x))) → residual. No biases. The first stage owns
the token embedding, the last the final RMSNorm and the LM head (the embedding matrix itself when
``tie_embeddings``).

A block does not run attention itself: ``attention_inputs`` gives Q, K, V and ``finish`` takes the
attention output, so the executor can pack and slice attention across groups (``executor``) and the
reference can run it densely (``reference``).

Layers are ``nn.Linear``/``nn.Embedding`` modules (bias-free) and ``RMSNorm`` modules, so torch's
tensor-parallel API (``parallelize_module``) can shard them by module name (``tensor_parallel``).

Initialisation is deterministic per module name: the generator of module ``name``'s weight is
seeded with (seed, crc32(name)), e.g. "layers.0.wq", so a stage built alone gets the same weights as
the whole model.
Weights ~ N(0, 1/fan_in) (unit-variance activations, non-trivial attention patterns for tests),
embedding ~ N(0, 1), norm gains = 1.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import skip_init

from slimpack.config import ModelConfig
from slimpack.runtime.ops import apply_rope, rms_norm, rope_tables, silu_gate

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "float | None"], torch.Tensor]
"""The executor's attention of one cell in one layer: (q (T, H, D), k, v (T, K, D), scale or None for
1/sqrt(D)) -> (T, H, D)."""


class RMSNorm(nn.Module):
    """RMSNorm with a gain vector (``weight``), through the memory-lean ``ops.rms_norm``."""

    def __init__(self, width: int, **factory: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(width, **factory))

    def forward(self, x_te: torch.Tensor) -> torch.Tensor:
        return rms_norm(x_te, self.weight)


def _linear(fan_in: int, fan_out: int, **factory: Any) -> nn.Linear:
    # skip_init: the weights are set by ``Transformer.reset_parameters`` (seeded by name), so
    # nn.Linear's own random initialisation would be wasted work
    return skip_init(nn.Linear, fan_in, fan_out, bias=False, **factory)


class Block(nn.Module):
    """One transformer layer's modules and its row-wise computations.

    ``num_heads`` and ``num_kv_heads`` are the heads *this rank* computes: the config's counts, or
    1/tp of them once ``tensor_parallel`` has split the projections (Q, K, V column-wise, so each
    rank's rows of ``wq``/``wk``/``wv`` are whole heads; ``wo`` row-wise).
    """

    def __init__(self, config: ModelConfig, **factory: Any) -> None:
        super().__init__()
        h, f, kv = config.hidden, config.ffn_hidden, config.kv_hidden
        self.config = config
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.attn_norm = RMSNorm(h, **factory)
        self.wq = _linear(h, h, **factory)
        self.wk = _linear(h, kv, **factory)
        self.wv = _linear(h, kv, **factory)
        self.wo = _linear(h, h, **factory)
        self.mlp_norm = RMSNorm(h, **factory)
        if config.ffn_kind == "swiglu":
            self.w_gate = _linear(h, f, **factory)
        self.w_up = _linear(h, f, **factory)
        self.w_down = _linear(f, h, **factory)

    def attention_inputs(self, x_te: torch.Tensor, cos_tc: torch.Tensor,
                         sin_tc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q (T, H, D), K and V (T, K, D) of this rank's heads after the attention norm, with RoPE
        on Q and K."""
        d = self.config.head_dim
        a_te = self.attn_norm(x_te)
        num_tokens = x_te.shape[0]
        q_thd = self.wq(a_te).view(num_tokens, self.num_heads, d)
        k_tkd = self.wk(a_te).view(num_tokens, self.num_kv_heads, d)
        v_tkd = self.wv(a_te).view(num_tokens, self.num_kv_heads, d)
        return apply_rope(q_thd, cos_tc, sin_tc), apply_rope(k_tkd, cos_tc, sin_tc), v_tkd

    def finish(self, x_te: torch.Tensor, attn_thd: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP block, residual: the layer's output (T, E)."""
        h1_te = x_te + self.wo(attn_thd.flatten(1))
        b_te = self.mlp_norm(h1_te)
        if self.config.ffn_kind == "swiglu":
            inner_tf = silu_gate(self.w_gate(b_te), self.w_up(b_te))
        else:
            inner_tf = F.gelu(self.w_up(b_te))
        return h1_te + self.w_down(inner_tf)


class Transformer(nn.Module):
    """The whole decoder; ``stage``/``split`` cut it into pipeline stages that share its modules."""

    def __init__(self, config: ModelConfig, **factory: Any) -> None:
        super().__init__()
        self.config = config
        self.embedding = skip_init(nn.Embedding, config.vocab_size, config.hidden, **factory)
        self.layers = nn.ModuleList(Block(config, **factory) for _ in range(config.num_layers))
        self.final_norm = RMSNorm(config.hidden, **factory)
        self.head = None if config.tie_embeddings else _linear(config.hidden, config.vocab_size, **factory)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.embedding.weight if self.head is None else self.head.weight

    def reset_parameters(self, seed: int) -> None:
        with torch.no_grad():
            for name, param in self.named_parameters():
                # seeded by the module's name ("layers.0.wq"), as when the parameters were bare
                key = name.removesuffix(".weight")
                rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
                if key.endswith("norm"):
                    param.fill_(1.0)
                    continue
                std = 1.0 if key == "embedding" else param.shape[1] ** -0.5
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
        """The stages of ``layer_ranges``."""
        return [self.stage(first, end) for first, end in layer_ranges(self.config.num_layers, num_stages, stage_layers)]


def layer_ranges(layers: int, num_stages: int, stage_layers: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Consecutive layer ranges [first, end): ``stage_layers`` layers each (a config's
    ``stage_layers``), or equal ones when it is empty (``layers`` must then divide evenly)."""
    if stage_layers:
        if len(stage_layers) != num_stages or sum(stage_layers) != layers or min(stage_layers) < 1:
            raise ValueError(f"stage_layers {list(stage_layers)} is not a split of {layers} layers "
                             f"into {num_stages} stages")
    elif num_stages < 1 or layers % num_stages:
        raise ValueError(f"{layers} layers cannot be split into {num_stages} equal stages")
    else:
        stage_layers = [layers // num_stages] * num_stages
    ends = np.cumsum([0, *stage_layers]).tolist()
    return list(zip(ends, ends[1:], strict=False))


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
        # a tied head is the embedding module itself (read through ``head_weight``)
        self.head = (model.head or model.embedding) if self.has_head else None

    @property
    def head_weight(self) -> torch.Tensor | None:
        if self.head is None:
            return None
        return self.head.weight

    def __repr__(self) -> str:
        parts = ["embedding"] * self.has_embedding + [f"layers {self.first_layer}..{self.end_layer - 1}"]
        return f"ModelStage({', '.join(parts + ['head'] * self.has_head)})"

    def position_table(self, positions_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What every layer needs to place tokens (RoPE cos/sin), for per-token positions."""
        return rope_tables(positions_t, self.config.head_dim, dtype=next(self.parameters()).dtype)

    def run_layer(self, index: int, x_te: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor],
                  attend: Attend) -> torch.Tensor:
        """Layer ``index`` (of this stage) on rows (T, E); ``attend(q, k, v, scale)`` does the attention."""
        block = self.layers[index]
        assert isinstance(block, Block)
        return block.finish(x_te, attend(*block.attention_inputs(x_te, *table), None))

    def embed(self, ids_t: torch.Tensor) -> torch.Tensor:
        assert self.embedding is not None, "only the first stage embeds tokens"
        return self.embedding(ids_t)

    def logits(self, x_te: torch.Tensor) -> torch.Tensor:
        assert self.final_norm is not None and self.head is not None, "only the last stage has the head"
        normed_te = self.final_norm(x_te)
        if isinstance(self.head, nn.Embedding):
            return F.linear(normed_te, self.head.weight)
        return self.head(normed_te)


def build_model(config: ModelConfig, *, seed: int = 0, dtype: torch.dtype = torch.float64,
                device: torch.device | str = "cpu") -> Transformer:
    """A ``Transformer`` for ``config`` with deterministic weights from ``seed``."""
    model = Transformer(config, device=device, dtype=dtype)
    model.reset_parameters(seed)
    return model
