"""Communication times: ring collectives and point-to-point transfers, alpha-beta model.

A ring all-gather or reduce-scatter of a ``size``-byte tensor over n ranks moves (n-1)/n·size bytes
through every link in n-1 steps; an all-reduce is both (Thakur et al., IJHPCA'05; the NCCL
performance notes use the same bus-bandwidth factors). Ranks are laid out Megatron-style with
tensor-parallel ranks innermost, then context, then data, then pipeline (rank order tp-cp-dp-pp), so
whether a group stays inside one node follows from its stride and size.
Must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from slimpack.config.cluster import ClusterConfig


def ring_gather_time(size_bytes: float, ranks: int, bandwidth: float, latency_s: float) -> float:
    """All-gather or reduce-scatter of a tensor whose full size is ``size_bytes``."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) / ranks * size_bytes / bandwidth + (ranks - 1) * latency_s


def ring_allreduce_time(size_bytes: float, ranks: int, bandwidth: float, latency_s: float) -> float:
    return 2.0 * ring_gather_time(size_bytes, ranks, bandwidth, latency_s)


def group_link(cluster: ClusterConfig, span_ranks: int) -> tuple[float, float]:
    """Bottleneck link of a group whose ranks occupy ``span_ranks`` consecutive ranks (aligned)."""
    return cluster.link(same_node=span_ranks <= cluster.gpus_per_node)


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective of a layer's pass: ``kind`` over ``ranks`` ranks of the ``group`` ("tp" or
    "cp"), on a tensor of ``size_bytes`` in all (every rank's shard together: the gathered result
    of an all-gather, the input of a reduce-scatter, the tensor of an all-reduce)."""

    kind: str
    group: str
    ranks: int
    size_bytes: float

    def sent_bytes(self) -> float:
        """Bytes each rank sends (ring): (n-1)/n of the tensor, twice for an all-reduce."""
        passes = 2 if self.kind == "all_reduce" else 1
        return passes * (self.ranks - 1) / self.ranks * self.size_bytes

    def time(self, bandwidth: float, latency_s: float) -> float:
        passes = 2 if self.kind == "all_reduce" else 1
        return passes * ring_gather_time(self.size_bytes, self.ranks, bandwidth, latency_s)
