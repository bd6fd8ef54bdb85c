"""Configuration values (frozen dataclasses, validated, JSON/TOML round-trip) and presets.

Must not import torch.
"""

from slimpack.config.cluster import ClusterConfig
from slimpack.config.config import Config, build_config, load_config, save_config
from slimpack.config.efficiency import EfficiencyConfig
from slimpack.config.hf import model_from_hf_config, read_hf_config, resolve_model
from slimpack.config.model import ModelConfig
from slimpack.config.parallel import ParallelConfig
from slimpack.config.planner import PlannerConfig
from slimpack.config.presets import CLUSTER_PRESETS, MODEL_PRESETS, cluster_preset, model_preset
from slimpack.config.train import TrainConfig

__all__ = [
    "CLUSTER_PRESETS", "MODEL_PRESETS", "ClusterConfig", "Config", "EfficiencyConfig", "ModelConfig",
    "ParallelConfig", "PlannerConfig", "TrainConfig", "build_config", "cluster_preset", "load_config",
    "model_from_hf_config", "model_preset", "read_hf_config", "resolve_model", "save_config",
]
