"""The whole configuration of a run: one tree of small frozen configs, with JSON/TOML round-trip."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from slimpack.config.base import ConfigBase
from slimpack.config.cluster import ClusterConfig
from slimpack.config.efficiency import EfficiencyConfig
from slimpack.config.hf import resolve_model
from slimpack.config.model import ModelConfig
from slimpack.config.parallel import ParallelConfig
from slimpack.config.planner import PlannerConfig
from slimpack.config.presets import cluster_preset
from slimpack.config.train import TrainConfig
from slimpack.errors import UserError
from slimpack.files import output_path, read_data_file

CONFIG_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Config(ConfigBase):
    model: ModelConfig
    """Transformer shape."""
    cluster: ClusterConfig
    """GPU and interconnect."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """tp/pp/dp/cp layout."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Context length, batch budget, recomputation."""
    efficiency: EfficiencyConfig = field(default_factory=EfficiencyConfig)
    """Time-model parameters (defaults or a calibration)."""
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    """Planner knobs."""

    def __post_init__(self) -> None:
        self.parallel.check(self.model, self.cluster)

    def to_dict(self) -> dict[str, Any]:
        return {"version": CONFIG_VERSION, **ConfigBase.to_dict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str | None = None) -> Config:
        data = dict(data)
        version = data.pop("version", CONFIG_VERSION)
        if version != CONFIG_VERSION:
            raise UserError(f"config version {version!r} is not supported (this slimpack reads {CONFIG_VERSION})")
        # Sections may name a preset instead of spelling it out: model = "llama2-7b" (or a path
        # to a Hugging Face config.json).
        if isinstance(data.get("model"), str):
            data["model"] = resolve_model(data["model"]).to_dict()
        if isinstance(data.get("cluster"), str):
            data["cluster"] = cluster_preset(data["cluster"]).to_dict()
        return super(Config, cls).from_dict(data, where=where or "config")


def build_config(*, model: str | ModelConfig = "llama2-7b", gpu: str | ClusterConfig = "h100-sxm",
                 **sections: Any) -> Config:
    """A Config from preset names (or a Hugging Face config.json path for the model) plus section
    overrides, e.g. ``parallel=ParallelConfig(tp=8)``."""
    model_cfg = resolve_model(model) if isinstance(model, str) else model
    cluster_cfg = cluster_preset(gpu) if isinstance(gpu, str) else gpu
    return Config(model=model_cfg, cluster=cluster_cfg, **sections)


def save_config(config: Config, path: str | Path) -> None:
    path = output_path(path)
    data = config.to_dict()
    if path.suffix == ".toml":
        path.write_text(tomli_w.dumps(data))
    else:
        path.write_text(json.dumps(data, indent=2) + "\n")


def load_config(path: str | Path) -> Config:
    """Read a config from ``.json`` or ``.toml``; errors name the file and the bad key."""
    return Config.from_dict(read_data_file(path, "config"), where=str(path))
