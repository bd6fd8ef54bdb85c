"""Which model the runtime runs: the home-made ``model.Transformer`` for a ``ModelConfig`` or preset,
transformers' own model (``hf_model``) for a Hugging Face ``config.json``; and its unsliced
reference run. transformers is imported only when a Hugging Face config is named."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from types import ModuleType

import torch

from slimpack.config import Config, ModelConfig
from slimpack.config.hf import is_hf_config
from slimpack.errors import UserError
from slimpack.runtime.model import Transformer, build_model
from slimpack.runtime.reference import reference_loss


def import_hf_model() -> ModuleType:
    """``runtime.hf_model``, or one clear line when transformers is missing."""
    try:
        return importlib.import_module("slimpack.runtime.hf_model")
    except ImportError as exc:
        raise UserError(f"a Hugging Face model needs transformers ({exc.name} is missing): "
                        f"install slimpack[hf]") from None


def layer_ops(hf_config: str | None) -> str:
    """Whose layer code the runtime runs (``TrainConfig.layer_ops``): transformers' modules for a Hugging
    Face config.json, slimpack's own otherwise."""
    return "transformers" if hf_config is not None else "slimpack"


def as_run(config: Config, hf_config: str | None) -> Config:
    """``config`` as the runtime runs the model: transformers' modules keep more activations than
    slimpack's (``layer_ops``) and run plain tensor parallelism (no sequence parallelism), so the
    memory and cost model then count what runs."""
    if hf_config is None:
        return config
    return dataclasses.replace(config, train=dataclasses.replace(config.train, layer_ops=layer_ops(hf_config)),
                               parallel=dataclasses.replace(config.parallel, sequence_parallel=False))


def runs_transformers(model: ModelConfig | str) -> bool:
    """Whether the runtime runs transformers' own model for ``model``: a Hugging Face config.json."""
    return isinstance(model, str) and is_hf_config(model)


def build_runtime_model(model: ModelConfig | str, config: ModelConfig, *, seed: int, dtype: torch.dtype,
                         device: torch.device | str) -> torch.nn.Module:
    """The model of shape ``config`` (``model`` resolved, possibly with more layers): transformers' own
    model when ``model`` names a Hugging Face config.json, else the home-made ``model.Transformer``."""
    if runs_transformers(model):
        build_hf_model = import_hf_model().build_hf_model  # transformers only when asked for
        return build_hf_model(model, num_layers=config.num_layers, seed=seed, dtype=dtype, device=device)
    return build_model(config, seed=seed, dtype=dtype, device=device)


def reference_run(net: torch.nn.Module, tokens: Mapping[int, torch.Tensor], num_loss: int) -> torch.Tensor:
    """Each sample alone, unsliced, gradients accumulated: the run a sliced execution must equal."""
    if isinstance(net, Transformer):
        return reference_loss(net, tokens, num_loss_tokens=num_loss)
    return import_hf_model().hf_reference_loss(net, tokens, num_loss_tokens=num_loss)
