"""Accelerator and interconnect figures of the cluster."""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.config.base import ConfigBase, require

MOST_GPUS = 2**20
"""Largest layout (and node) a config accepts: several times the largest clusters built, and small
enough that every rank index and per-rank array stays cheap and inside numpy's int64."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig(ConfigBase):
    name: str
    """Preset name (the GPU model) or a user label."""
    peak_flops: float
    """Peak dense bf16 tensor-core FLOP/s of one GPU (no sparsity)."""
    memory_bytes: int
    """HBM capacity of one GPU in bytes."""
    reserved_memory_bytes: int = 3 * 2**30
    """Memory a plan may not use: CUDA context, NCCL buffers, allocator fragmentation."""
    hbm_bandwidth: float
    """HBM bandwidth in bytes/s (used for memory-bound work such as the optimizer step)."""
    gpus_per_node: int = 8
    """GPUs sharing the intra-node fabric (NVLink/NVSwitch)."""
    intra_node_bandwidth: float
    """Unidirectional bytes/s between two GPUs of one node."""
    intra_node_latency_s: float = 3e-6
    """Per-message latency inside a node."""
    inter_node_bandwidth: float
    """Unidirectional bytes/s per GPU across nodes (its share of the node's NICs)."""
    inter_node_latency_s: float = 10e-6
    """Per-message latency across nodes."""

    def __post_init__(self) -> None:
        for name in ("peak_flops", "memory_bytes", "hbm_bandwidth", "gpus_per_node",
                     "intra_node_bandwidth", "inter_node_bandwidth"):
            value = getattr(self, name)
            require(value > 0, f"cluster {self.name!r}: {name} must be positive, got {value!r}")
        for name in ("intra_node_latency_s", "inter_node_latency_s", "reserved_memory_bytes"):
            value = getattr(self, name)
            require(value >= 0, f"cluster {self.name!r}: {name} must be >= 0, got {value!r}")
        require(self.gpus_per_node <= MOST_GPUS,
                f"cluster {self.name!r}: gpus_per_node must be at most 2**20, got {self.gpus_per_node!r}")
        require(self.reserved_memory_bytes < self.memory_bytes,
                f"cluster {self.name!r}: reserved_memory_bytes must be below memory_bytes")

    @property
    def usable_memory_bytes(self) -> int:
        """What a plan may fill: capacity minus the reserve."""
        return self.memory_bytes - self.reserved_memory_bytes

    def link(self, *, same_node: bool) -> tuple[float, float]:
        """(bandwidth bytes/s, latency s) of a point-to-point link."""
        if same_node:
            return self.intra_node_bandwidth, self.intra_node_latency_s
        return self.inter_node_bandwidth, self.inter_node_latency_s
