"""A config from a starting point plus the values a user changed: the one rule that the CLI's flags
and the Python API's keyword arguments both follow (a value left as ``None`` keeps the start's).

Must not import torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from slimpack.config.cluster import ClusterConfig
from slimpack.config.config import Config, build_config, load_config
from slimpack.config.efficiency import efficiency_preset
from slimpack.config.model import ModelConfig
from slimpack.config.planner import PlannerConfig
from slimpack.errors import UserError

PLANNER_FIELDS = frozenset(field.name for field in dataclasses.fields(PlannerConfig))


def starting_config(base: Config | str | None) -> Config:
    """``base`` as a Config: itself, a config file's (its path), or :func:`build_config`'s defaults."""
    return build_config() if base is None else load_config(base) if isinstance(base, str) else base


def configure(base: Config | str | None = None, *, model: str | ModelConfig | None = None,
              gpu: str | ClusterConfig | None = None, tp: int | None = None, pp: int | None = None,
              dp: int | None = None, cp: int | None = None, vpp: int | None = None,
              stage_layers: Sequence[int] | None = None,
              max_context: int | None = None, global_batch_tokens: int | None = None,
              micro_batch_tokens: int | None = None, recompute: str | None = None, seed: int | None = None,
              cut_documents: bool | None = None, kernels: str | None = None,
              planner: Mapping[str, Any] | None = None) -> Config:
    """``base`` (a Config, a config file's path, or ``None`` for :func:`build_config`'s defaults)
    with the given values replaced: the model (a preset name, a Hugging Face ``config.json`` or a
    ModelConfig), the GPU, the layout (``stage_layers``: layers per model chunk, ``()`` for an even
    split), the training step, the kernel family and planner fields."""
    start = starting_config(base)
    unknown = sorted(set(planner or {}) - PLANNER_FIELDS)
    if unknown:
        raise UserError(f"unknown planner setting(s) {', '.join(unknown)}; valid: {', '.join(sorted(PLANNER_FIELDS))}")
    split = None if stage_layers is None else tuple(stage_layers)
    return build_config(
        model=model or start.model, gpu=gpu or start.cluster,
        parallel=_override(start.parallel, tp=tp, pp=pp, dp=dp, cp=cp, virtual_stages=vpp, stage_layers=split),
        train=_override(start.train, max_context=max_context, global_batch_tokens=global_batch_tokens,
                        micro_batch_tokens=micro_batch_tokens, recompute=recompute, seed=seed,
                        cut_documents=cut_documents),
        efficiency=efficiency_preset(kernels) if kernels else start.efficiency,
        planner=_override(start.planner, **(planner or {})))


def _override(value: Any, **changes: Any) -> Any:
    given = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(value, **given) if given else value


__all__ = ["PLANNER_FIELDS", "configure", "starting_config"]
