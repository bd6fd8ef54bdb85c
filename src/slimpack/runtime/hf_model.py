"""Hugging Face decoder models (Llama, Mistral, Qwen2, Qwen3) as runtime stages (needs transformers,
the ``hf`` extra).

The model is transformers' own ``*ForCausalLM``, built from a ``config.json`` (random weights from a
seed, or the checkpoint's weights when ``*.safetensors`` files lie beside it) and cut into stages by
layer ranges like the home-made ``model.Transformer``: the first stage owns ``embed_tokens``, the
last ``norm`` and ``lm_head``. A stage runs each decoder layer unchanged on one cell's packed rows
(a batch of one row, ``use_cache=False``, no mask) with the rotary tables of the cell's per-document
positions; slices of one document continue its positions.

Attention is routed through transformers' ``AttentionInterface``: the models run with the
implementation registered here as ``"slimpack"``, and each layer hands its Q, K, V (after its own
projections, q/k norms and RoPE) to that function together with the keyword arguments the stage
passed to the layer. The stage passes the executor's ``attend`` (packed segments, K/V prefixes of
earlier slices, published K/V for later ones), so the sliced, asymmetric execution is the
executor's and every other op is the model's. Called without it (the model's own ``forward``, e.g.
the unpacked reference), the function is transformers' sdpa attention.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from slimpack.config import ModelConfig
from slimpack.config.hf import model_from_hf_config, read_hf_config
from slimpack.errors import UserError
from slimpack.runtime.loss import count_loss_tokens
from slimpack.runtime.model import Attend, layer_ranges

ATTENTION = "slimpack"
"""The name of the executor's attention in transformers' ``AttentionInterface``."""
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""Families whose ``*Model.forward`` is embed -> layers -> norm, which the stages reproduce (Gemma,
plannable, scales its embeddings inside ``forward`` and is not run)."""


def _attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: q (1, H, T, D), k/v (1, K, T, D) -> ((1, T, H, D), None)."""
    attend: Attend | None = kwargs.pop("slimpack_attend", None)
    if attend is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    assert not dropout, "build_hf_model refuses attention dropout"
    out_thd = attend(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), scaling)
    return out_thd[None], None


AttentionInterface.register(ATTENTION, _attention)


class HFModel(nn.Module):
    """A transformers causal LM (``hf``) with the ``ModelConfig`` that describes its shape."""

    def __init__(self, hf: nn.Module, config: ModelConfig) -> None:
        super().__init__()
        self.hf = hf
        self.config = config

    def stage(self, first_layer: int, end_layer: int) -> HFStage:
        return HFStage(self, first_layer, end_layer)

    def split(self, num_stages: int, stage_layers: Sequence[int] = ()) -> list[HFStage]:
        return [self.stage(first, end) for first, end in layer_ranges(self.config.num_layers, num_stages, stage_layers)]


class HFStage(nn.Module):
    """Layers [first_layer, end_layer) of an ``HFModel``, with the executor's stage interface
    (``position_table``, ``run_layer``, ``embed``, ``logits``; parameters are shared)."""

    def __init__(self, model: HFModel, first_layer: int, end_layer: int) -> None:
        super().__init__()
        base = model.hf.model
        self.config = model.config
        self.first_layer, self.end_layer = first_layer, end_layer
        self.has_embedding = first_layer == 0
        self.has_head = end_layer == model.config.num_layers
        self.layers = nn.ModuleList(base.layers[first_layer:end_layer])
        self.embedding = base.embed_tokens if self.has_embedding else None
        self.final_norm = base.norm if self.has_head else None
        self.head = model.hf.lm_head if self.has_head else None
        self.rotary = base.rotary_emb

    def __repr__(self) -> str:
        return f"HFStage(layers {self.first_layer}..{self.end_layer - 1})"

    def position_table(self, positions_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        like = next(self.parameters())  # the rotary embedding reads only dtype and device from it
        return self.rotary(like, positions_t[None])

    def run_layer(self, index: int, x_te: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor],
                  attend: Attend) -> torch.Tensor:
        out = self.layers[index](x_te[None], attention_mask=None, use_cache=False, position_embeddings=table,
                                 slimpack_attend=attend)
        return out[0]

    def embed(self, ids_t: torch.Tensor) -> torch.Tensor:
        assert self.embedding is not None, "only the first stage embeds tokens"
        return self.embedding(ids_t)

    def logits(self, x_te: torch.Tensor) -> torch.Tensor:
        assert self.final_norm is not None and self.head is not None, "only the last stage has the head"
        return self.head(self.final_norm(x_te))


def build_hf_model(path: str | Path, *, num_layers: int | None = None, seed: int = 0,
                   dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> HFModel:
    """The model of the Hugging Face ``config.json`` at ``path`` (file or directory): the checkpoint's
    weights when ``*.safetensors`` lie beside it, else random weights drawn from ``seed`` (torch's
    global generator is left as it was). ``num_layers`` overrides the config's layer count (random
    weights only: a checkpoint with another count is refused)."""
    data = read_hf_config(path)
    if data.get("model_type") not in MODEL_TYPES:
        raise UserError(f"{path}: the runtime runs Hugging Face model types {', '.join(MODEL_TYPES)}, "
                        f"not {data.get('model_type')!r}")
    if data.get("attention_dropout"):  # random per call: no two runs could agree
        raise UserError(f"{path}: attention_dropout={data['attention_dropout']} is not supported; set it to 0")
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    config = model_from_hf_config(data, name=folder.resolve().name)
    checkpoint = any(folder.glob("*.safetensors"))
    if num_layers is not None and num_layers != config.num_layers:
        if checkpoint:
            raise UserError(f"{folder}: the checkpoint has {config.num_layers} layers, the pipeline's stages "
                            f"need {num_layers}; pick a pp x virtual stages (or stage_layers) that splits "
                            f"{config.num_layers} layers")
        data = {**data, "num_hidden_layers": num_layers}
        if "layer_types" in data:  # all full attention (config.hf refuses others), one per layer
            data["layer_types"] = ["full_attention"] * num_layers
    fields = {key: value for key, value in data.items() if key != "model_type"}
    hf_config = AutoConfig.for_model(data["model_type"], **fields)
    hf_config._attn_implementation = ATTENTION
    if checkpoint:
        hf = AutoModelForCausalLM.from_pretrained(folder, config=hf_config, dtype=dtype, local_files_only=True)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            hf = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    hf.train()
    return HFModel(hf.to(device), dataclasses.replace(config, num_layers=data["num_hidden_layers"]))


def hf_reference_loss(model: HFModel, tokens: Mapping[int, torch.Tensor], *, num_loss_tokens: int | None = None,
                      backward: bool = True) -> torch.Tensor:
    """The model's own forward, each sample alone and unpacked (transformers' sdpa attention):
    Σ token cross-entropies / ``num_loss_tokens``; gradients accumulate sample by sample."""
    n = num_loss_tokens if num_loss_tokens is not None else count_loss_tokens(t.shape[0] for t in tokens.values())
    total = torch.zeros((), dtype=torch.float64)
    for sample_id in sorted(tokens):
        ids = tokens[sample_id]
        if ids.shape[0] < 2:
            continue  # no loss token
        logits_1tv = model.hf(input_ids=ids[None], use_cache=False).logits
        loss = F.cross_entropy(logits_1tv[0, :-1], ids[1:], reduction="sum") / max(n, 1)
        if backward:
            loss.backward()
        total = total + loss.detach().to(torch.float64)
    return total
