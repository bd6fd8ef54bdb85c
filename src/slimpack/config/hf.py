"""Model shapes from a Hugging Face ``config.json`` (a file, or a directory holding one).

Planning needs only the shape of the model (layers, widths, heads, vocabulary), so the file is read
with :mod:`json`; transformers is not needed. Decoder families whose layers have the shape
:class:`~slimpack.config.model.ModelConfig` describes (RMSNorm, RoPE, grouped-query attention, a
gated MLP of three ``hidden x intermediate`` matrices) are accepted: ``llama``, ``mistral``,
``qwen2``, ``qwen3`` and ``gemma``. Features the cost model does not describe are refused with one
line naming the key: mixture-of-experts, sliding-window attention, a ``head_dim`` other than
``hidden_size / num_attention_heads``, multimodal (nested ``text_config``) configs.

What is deliberately ignored, because it does not change the planning costs by more than a rounding
error: biases (Qwen2's QKV bias), Qwen3's per-head q/k norms, RoPE scaling, dropout, token ids.
``dtype_bytes`` stays at the training precision default (bf16), whatever ``torch_dtype`` says the
checkpoint was saved in.

Must not import torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slimpack.config.model import ModelConfig
from slimpack.config.presets import MODEL_PRESETS
from slimpack.errors import UserError
from slimpack.files import read_data_file

SUPPORTED_MODEL_TYPES: dict[str, bool] = {"llama": False, "mistral": False, "qwen2": False,
                                          "qwen3": False, "gemma": True}
"""model_type -> the default of ``tie_word_embeddings`` in that family's transformers config
class (used when the file leaves it out)."""

_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
_GATED_ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new")


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` at ``path`` (the file, or a directory that holds one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"{path}: no such file (expected a Hugging Face config.json or a directory "
                        f"holding one)")
    data = read_data_file(path, "Hugging Face config")
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def model_from_hf_config(data: dict[str, Any], *, name: str, dtype_bytes: int = 2) -> ModelConfig:
    """Map the fields of a Hugging Face decoder config onto :class:`ModelConfig`.

    ``name`` labels the result (e.g. the checkpoint's directory name). Unsupported architectures
    and features raise :class:`UserError` with one line that names the offending key.
    """
    where = f"Hugging Face config {name!r}"
    model_type = data.get("model_type")
    if "text_config" in data:
        raise UserError(f"{where}: multimodal configs (text_config) are not supported; point "
                        f"--model at a text-only decoder config")
    moe = [key for key in _MOE_KEYS if data.get(key)]
    if moe:
        raise UserError(f"{where}: mixture-of-experts ({moe[0]}={data[moe[0]]}) is not supported: "
                        f"the cost model describes dense layers only")
    # a hand-edited config can hold any JSON here; only a known name is hashable and supported
    if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(f"{where}: model_type {model_type!r} is not supported; supported: "
                        f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    _refuse_sliding_window(data, where)
    act = data.get("hidden_act", data.get("hidden_activation", "silu"))
    if act not in _GATED_ACTIVATIONS:
        raise UserError(f"{where}: hidden_act {act!r} is not supported; expected one of "
                        f"{list(_GATED_ACTIVATIONS)} (a gated MLP)")
    hidden = _field(data, "hidden_size", where)
    num_heads = _field(data, "num_attention_heads", where)
    head_dim = None if data.get("head_dim") is None else _field(data, "head_dim", where)
    if head_dim is not None and head_dim * num_heads != hidden:
        raise UserError(f"{where}: head_dim={head_dim} differs from hidden_size/num_attention_heads "
                        f"= {hidden}/{num_heads}; such attention widths are not modelled")
    return ModelConfig(
        name=name,
        num_layers=_field(data, "num_hidden_layers", where),
        hidden=hidden,
        num_heads=num_heads,
        # transformers' own default: no num_key_value_heads means multi-head attention
        num_kv_heads=data.get("num_key_value_heads") or num_heads,
        ffn_hidden=_field(data, "intermediate_size", where),
        ffn_kind="swiglu",  # a gated MLP (SwiGLU or GeGLU): three hidden x intermediate matrices
        vocab_size=_field(data, "vocab_size", where),
        dtype_bytes=dtype_bytes,
        tie_embeddings=bool(data.get("tie_word_embeddings", SUPPORTED_MODEL_TYPES[model_type])),
    )


def _refuse_sliding_window(data: dict[str, Any], where: str) -> None:
    # Qwen2/Qwen3 write a sliding_window size but only use it with use_sliding_window=true;
    # Mistral uses it whenever it is set; newer configs list the attention kind of every layer.
    if "use_sliding_window" in data:
        active = bool(data["use_sliding_window"])
    else:
        active = data.get("sliding_window") is not None
    layer_types = data.get("layer_types") or []
    if not isinstance(layer_types, list):
        raise UserError(f"{where}: layer_types must be a list of attention kinds, got {layer_types!r}")
    if active or any(kind != "full_attention" for kind in layer_types):
        raise UserError(f"{where}: sliding-window attention (sliding_window="
                        f"{data.get('sliding_window')}) is not supported: the cost model assumes "
                        f"full causal attention")


def _field(data: dict[str, Any], key: str, where: str) -> int:
    value = data.get(key)
    if value is None:
        raise UserError(f"{where}: missing {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def is_hf_config(name_or_path: str | Path) -> bool:
    """Whether ``--model`` names a Hugging Face config (a model the runtime builds with transformers)
    rather than a preset or a slimpack model JSON."""
    if isinstance(name_or_path, str) and name_or_path in MODEL_PRESETS:
        return False
    return Path(name_or_path).exists() and "model_type" in read_hf_config(name_or_path)


def resolve_model(name_or_path: str | Path) -> ModelConfig:
    """What ``--model`` accepts: a preset name, a Hugging Face ``config.json`` (file or directory),
    or a slimpack model JSON (the fields of :class:`ModelConfig`)."""
    if isinstance(name_or_path, str) and name_or_path in MODEL_PRESETS:
        return MODEL_PRESETS[name_or_path]
    path = Path(name_or_path)
    if not path.exists():
        raise UserError(f"unknown model {str(name_or_path)!r}; valid: {', '.join(sorted(MODEL_PRESETS))}, "
                        f"or a path to a Hugging Face config.json (file or directory)")
    data = read_hf_config(path)
    config_file = path / "config.json" if path.is_dir() else path
    if "model_type" not in data and "num_layers" in data:  # slimpack's own ModelConfig fields
        return ModelConfig.from_dict(data, where=str(config_file))
    # The checkpoint's directory names it (".../Meta-Llama-3-8B/config.json" -> Meta-Llama-3-8B).
    name = config_file.resolve().parent.name if config_file.name == "config.json" else config_file.stem
    return model_from_hf_config(data, name=name)


__all__ = ["SUPPORTED_MODEL_TYPES", "is_hf_config", "model_from_hf_config", "read_hf_config", "resolve_model"]
