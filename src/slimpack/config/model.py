"""Transformer shape (Llama-style decoder: RMSNorm, RoPE, GQA attention, SwiGLU or GELU MLP)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimpack.config.base import ConfigBase, require


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig(ConfigBase):
    name: str
    """Preset name or a user label; informational."""
    num_layers: int
    """Number of transformer layers."""
    hidden: int
    """Model width h."""
    num_heads: int
    """Query heads; head_dim = hidden / num_heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention); equals num_heads for multi-head attention."""
    ffn_hidden: int
    """MLP inner width f."""
    ffn_kind: Literal["swiglu", "gelu"] = "swiglu"
    """SwiGLU has three f x h matrices (gate, up, down); GELU has two."""
    vocab_size: int
    """Vocabulary size V (embedding and LM head are V x h)."""
    dtype_bytes: int = 2
    """Bytes per activation/parameter element in training (2 for bf16)."""
    tie_embeddings: bool = False
    """Share the input embedding with the LM head."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "num_heads", "num_kv_heads", "ffn_hidden", "vocab_size"):
            value = getattr(self, name)
            require(isinstance(value, int) and value > 0, f"model {self.name!r}: {name} must be a positive integer, got {value!r}")
        require(self.hidden % self.num_heads == 0,
                f"model {self.name!r}: hidden={self.hidden} is not divisible by num_heads={self.num_heads}")
        require(self.num_heads % self.num_kv_heads == 0,
                f"model {self.name!r}: num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        require(self.dtype_bytes in (1, 2, 4, 8), f"model {self.name!r}: dtype_bytes must be 1, 2, 4 or 8, got {self.dtype_bytes}")
        require(self.ffn_kind in ("swiglu", "gelu"), f"model {self.name!r}: ffn_kind must be 'swiglu' or 'gelu', got {self.ffn_kind!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def kv_hidden(self) -> int:
        """Width of K (and of V): num_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def num_ffn_matrices(self) -> int:
        return 3 if self.ffn_kind == "swiglu" else 2

    def layer_params(self) -> int:
        """Parameters of one transformer layer (weights of QKV, output, MLP, and two norm gains)."""
        attn = self.hidden * (self.hidden + 2 * self.kv_hidden) + self.hidden * self.hidden
        mlp = self.num_ffn_matrices * self.hidden * self.ffn_hidden
        return attn + mlp + 2 * self.hidden

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden

    def num_params(self) -> int:
        """All parameters: layers, input embedding, final norm, and the LM head unless tied."""
        head = 0 if self.tie_embeddings else self.embedding_params()
        return self.num_layers * self.layer_params() + self.embedding_params() + self.hidden + head
