"""Scale an op-level efficiency fit so that whole executor steps come out right.

``cost.calibrate`` fits the efficiency parameters to single-op timings. Whole groups run through the
runtime's executor also pay for what single ops miss (packing, cells, RoPE tables, the loss) and
show this machine's real backward/forward ratios. Given the measured forward + backward time of a
few groups (single samples and packs) through the whole model, this fits

    measured = g · (the op fit's GEMM time) + a · (its attention time) + overhead · (layers run) + rest

by relative least squares, divides the GEMM and attention efficiencies by g and a, and takes the
fitted per-layer overhead. Must not import torch (the timings come from ``runtime.calibrate``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slimpack.config import ClusterConfig, Config, EfficiencyConfig, ParallelConfig
from slimpack.config.efficiency import with_attention_scale
from slimpack.cost.model import CostModel

END_TO_END_GROUPS: tuple[tuple[int, ...], ...] = (
    (256,), (1024,), (2048,), (256,) * 8, (128,) * 16, (512,) * 4, (1024, 512, 256, 128, 64, 64))
"""Groups (sample lengths) whose executor time the fit matches: single samples and packs."""


def measured_cluster(*, peak_flops: float, bandwidth: float, memory_bytes: int, devices: int = 1) -> ClusterConfig:
    """This machine as a cluster: measured peak FLOP/s and memory bandwidth, one node."""
    return ClusterConfig(name="measured-cpu", peak_flops=peak_flops, memory_bytes=memory_bytes,
                         reserved_memory_bytes=0, hbm_bandwidth=bandwidth, gpus_per_node=max(devices, 1),
                         intra_node_bandwidth=bandwidth, inter_node_bandwidth=bandwidth)


@dataclass(frozen=True, slots=True, kw_only=True)
class EndToEndFit:
    efficiency: EfficiencyConfig
    """The op fit scaled to the executor's whole-group times."""
    gemm_ratio: float
    """g: measured GEMM time / the op fit's."""
    attention_ratio: float
    """a: measured attention time / the op fit's."""
    errors: tuple[tuple[int, float], ...]
    """(tokens of the group, predicted / measured − 1) per group, after the fit."""


def _group_times(config: Config, groups: Sequence[Sequence[int]], efficiency: EfficiencyConfig) -> np.ndarray:
    """Predicted forward + backward seconds of each group on one single-device stage."""
    cost = CostModel(dataclasses.replace(config, efficiency=efficiency, parallel=ParallelConfig()))
    return np.array([sum(cost.group_time(list(g), [0] * len(g), virtual_stage=0, backward=b) for b in (False, True))
                     for g in groups])


def fit_end_to_end(config: Config, efficiency: EfficiencyConfig, measured_s: Sequence[float],
                   groups: Sequence[Sequence[int]] = END_TO_END_GROUPS) -> EndToEndFit:
    """Fit g, a and the per-layer overhead to ``measured_s`` (the executor's time of each group under
    ``config``'s model and cluster; see the module docstring)."""
    measured = np.asarray(measured_s, dtype=float)
    bare = dataclasses.replace(efficiency, layer_overhead_s=0.0)
    compute = _group_times(config, groups, bare)
    # the parts of the prediction: GEMM time, attention time (each ∝ 1 / its efficiency), per-layer overhead
    gemm = _group_times(config, groups, dataclasses.replace(bare, gemm_max=efficiency.gemm_max / 2)) - compute
    attention = _group_times(config, groups, with_attention_scale(bare, 2.0)) - compute
    per_overhead = (_group_times(config, groups, dataclasses.replace(bare, layer_overhead_s=1e-3)) - compute) / 1e-3
    rest = compute - gemm - attention
    weights = 1.0 / measured  # relative least squares: short groups count as much as long ones
    features = np.stack([gemm, attention, per_overhead], axis=1)
    solution, *_ = np.linalg.lstsq(features * weights[:, None], (measured - rest) * weights, rcond=None)
    g, a, overhead = (float(x) for x in solution)
    if min(g, a, overhead) <= 0:  # degenerate: one common factor, no separate overhead
        g = a = float(np.median(measured / compute))
        overhead = 0.0
    scaled = dataclasses.replace(with_attention_scale(efficiency, a), gemm_max=min(1.0, efficiency.gemm_max / g),
                                 layer_overhead_s=overhead)
    predicted = _group_times(config, groups, scaled)
    errors = tuple((sum(group), float(p / m - 1)) for group, m, p in zip(groups, measured, predicted, strict=True))
    return EndToEndFit(efficiency=scaled, gemm_ratio=g, attention_ratio=a, errors=errors)
