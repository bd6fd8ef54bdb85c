"""What a training step is: context length, batch size, recomputation, optimizer sharding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slimpack.config.base import ConfigBase, require

MOST_TOKENS = 2**40
"""Largest context or batch, in tokens, a config accepts. No real run comes near it (batches are tens
of millions of tokens), and it keeps every token count and its prefix sums inside numpy's int64."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig(ConfigBase):
    max_context: int = 65536
    """Longest sequence a sample may have; longer documents are cut into chunks of this length."""
    global_batch_tokens: int = 4 * 2**20
    """Token budget of one global batch (all replicas, one optimizer step)."""
    micro_batch_tokens: int | None = None
    """Most tokens a baseline packs into one micro-batch, its packers' token cap (Megatron's micro-batch
    size times its sequence length, TRL's per-device batch times its packed length, verl's
    ``max_token_len_per_gpu``); None: ``max_context``, one context-length sequence per micro-batch.
    Where memory allows more, a larger cap makes fewer, fuller micro-batches: less per-group overhead,
    larger pipeline bubbles (``docs/baseline-caps.md``). SlimPack sizes its MicroPacks by cost and
    memory, and SlimPipe slices context-length sequences: both ignore it."""
    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recomputation: none; selective (core attention rerun in backward); full (only each
    layer's input kept, the layer's forward rerun in backward). The default is ``none``: with
    FlashAttention, selective recomputation saves only the float32 log-sum-exp (4 bytes per head per
    token; the s² scores it exists to drop are never stored, and the attention output stays as the
    output projection's input) at the price of an attention forward in every backward, so it is never
    the better choice; use ``full`` where a layout does not fit without it."""
    layer_ops: Literal["slimpack", "transformers"] = "slimpack"
    """Whose layer code the runtime runs, for the memory model: slimpack's lean ops (``slimpack``), or
    transformers' own modules (``transformers``: ``--model config.json`` in ``train``, ``verify`` and
    ``fidelity``), which also keep each RMSNorm's normalised copy and the MLP's SiLU output."""
    distributed_optimizer: bool = True
    """Shard fp32 master weights and Adam moments over the data-parallel group (ZeRO-1)."""
    seed: int = 0
    """Seed for batch sampling and any randomised planning step."""
    cut_documents: bool = False
    """Cut each batch's documents where fixed-length sequences of ``max_context`` tokens end, as
    Megatron's fixed-length packing does, and train every piece as a sample of its own (a piece
    does not attend to its document's earlier tokens). Every strategy then trains the same pieces
    that ``fixed`` and SlimPipe make of the documents, so they compare on the same work; off,
    those two cut the documents themselves and train less attention than the others."""

    def __post_init__(self) -> None:
        for name in ("max_context", "global_batch_tokens"):
            value = getattr(self, name)
            require(isinstance(value, int) and 1 <= value <= MOST_TOKENS,
                    f"{name} must be a positive integer of at most 2**40 tokens, got {value!r}")
        require(self.micro_batch_tokens is None or (isinstance(self.micro_batch_tokens, int)
                                                     and self.max_context <= self.micro_batch_tokens <= MOST_TOKENS),
                f"micro_batch_tokens must be at least max_context ({self.max_context}): a micro-batch holds "
                f"the longest sample; and at most 2**40; got {self.micro_batch_tokens!r}")
        require(self.layer_ops in ("slimpack", "transformers"),
                f"layer_ops must be 'slimpack' or 'transformers', got {self.layer_ops!r}")
        require(isinstance(self.cut_documents, bool),
                f"cut_documents must be true or false, got {self.cut_documents!r}")
        require(self.recompute in ("none", "selective", "full"),
                f"recompute must be 'none', 'selective' or 'full', got {self.recompute!r}")

    @property
    def micro_batch_cap(self) -> int:
        """The token cap of a baseline's micro-batch (``micro_batch_tokens``, by default ``max_context``)."""
        return self.micro_batch_tokens or self.max_context
