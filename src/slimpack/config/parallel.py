"""The hybrid-parallel layout: tensor (tp), pipeline (pp, with virtual stages), data (dp), context (cp)."""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.config.base import ConfigBase, require
from slimpack.config.cluster import MOST_GPUS, ClusterConfig
from slimpack.config.model import ModelConfig


def layout_rank(replica: int, stage: int, cp_rank: int, tp_rank: int, *, dp: int, cp: int, tp: int) -> int:
    """The global rank of a device, laid out Megatron-style with tp innermost, then cp, dp and pp.
    The runtime's mesh places processes by it, and the cost model reads from it which groups stay
    inside one node."""
    return ((stage * dp + replica) * cp + cp_rank) * tp + tp_rank


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
    stage_layers: tuple[int, ...] = ()
    """Transformer layers of each model chunk, in layer order (pp·virtual_stages entries; chunk c of
    stage s is entry c·pp + s); empty = an even split. An uneven split lets the first stage (which
    also embeds) and the last (final norm, LM head, loss) carry fewer layers: see
    ``slimpack.cost.stages.balanced_stage_layers``."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "virtual_stages"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, f"parallel layout: {name} must be an integer >= 1, got {value!r}")
        require(self.num_devices <= MOST_GPUS,
                f"parallel layout: tp*pp*dp*cp = {self.num_devices} GPUs; at most 2**20 ({MOST_GPUS:,}) are planned")
        require(all(isinstance(n, int) and n >= 1 for n in self.stage_layers),
                f"parallel layout: stage_layers must be integers >= 1, got {list(self.stage_layers)}")
        require(not self.stage_layers or len(self.stage_layers) == self.pp * self.virtual_stages,
                f"parallel layout: stage_layers has {len(self.stage_layers)} entries, expected "
                f"pp*virtual_stages = {self.pp * self.virtual_stages} (--stage-layers even or balanced re-splits)")

    @property
    def num_devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def rank(self, replica: int, stage: int, cp_rank: int = 0, tp_rank: int = 0) -> int:
        """The global rank of a device of this layout (``layout_rank``)."""
        return layout_rank(replica, stage, cp_rank, tp_rank, dp=self.dp, cp=self.cp, tp=self.tp)

    @property
    def devices_per_stage(self) -> int:
        """GPUs that run one pipeline stage together (tp x cp)."""
        return self.tp * self.cp

    def chunk_layers(self, num_layers: int) -> tuple[int, ...]:
        """Layers of each model chunk (virtual stage) in layer order: ``stage_layers`` or even."""
        if self.stage_layers:
            return self.stage_layers
        chunks = self.pp * self.virtual_stages
        return (num_layers // chunks,) * chunks

    def check(self, model: ModelConfig, cluster: ClusterConfig) -> None:
        """Raise a ``UserError`` that explains why this layout cannot run ``model`` on ``cluster``."""
        chunks = self.pp * self.virtual_stages
        if self.stage_layers:
            require(sum(self.stage_layers) == model.num_layers,
                    f"stage_layers {list(self.stage_layers)} sum to {sum(self.stage_layers)} layers, "
                    f"{model.name} has {model.num_layers}")
        else:
            require(model.num_layers % chunks == 0,
                    f"{model.name} has {model.num_layers} layers, not divisible by pp*virtual_stages = "
                    f"{self.pp}*{self.virtual_stages} = {chunks}: give an uneven split (--stage-layers balanced, or "
                    f"layers per chunk; parallel.stage_layers in a --config file; `slimpack tune` proposes one)")
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
