"""The hybrid-parallel layout: tensor (tp), pipeline (pp, with virtual stages), data (dp), context (cp)."""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.config.base import ConfigBase, require
from slimpack.config.cluster import ClusterConfig
from slimpack.config.model import ModelConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig(ConfigBase):
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row split inside a layer)."""
    pp: int = 1
    """Pipeline stages."""
    dp: int = 1
    """Data-parallel replicas."""
    cp: int = 1
    """Context-parallel degree of every pipeline (each sequence split over cp GPUs)."""
    virtual_stages: int = 1
    """Model chunks per pipeline stage (interleaved 1F1B when > 1)."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism: norms and dropout sharded over tp (activations / tp)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "virtual_stages"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, f"parallel layout: {name} must be an integer >= 1, got {value!r}")

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def devices_per_stage(self) -> int:
        """GPUs that run one pipeline stage together (tp x cp)."""
        return self.tp * self.cp

    def check(self, model: ModelConfig, cluster: ClusterConfig) -> None:
        """Raise a ``UserError`` that explains why this layout cannot run ``model`` on ``cluster``."""
        chunks = self.pp * self.virtual_stages
        require(model.num_layers % chunks == 0,
                f"{model.name} has {model.num_layers} layers, not divisible by pp*virtual_stages = "
                f"{self.pp}*{self.virtual_stages} = {chunks}")
        require(model.num_heads % self.tp == 0,
                f"{model.name} has {model.num_heads} attention heads, not divisible by tp={self.tp}")
        require(model.num_kv_heads % self.tp == 0,
                f"{model.name} has {model.num_kv_heads} KV heads, not divisible by tp={self.tp} "
                f"(each tensor-parallel rank needs whole KV heads)")
        require(model.ffn_hidden % self.tp == 0,
                f"{model.name} has ffn_hidden={model.ffn_hidden}, not divisible by tp={self.tp}")
        require(self.tp <= cluster.gpus_per_node,
                f"tp={self.tp} exceeds the {cluster.gpus_per_node} GPUs of a {cluster.name} node; "
                f"tensor parallelism across nodes is not supported")
