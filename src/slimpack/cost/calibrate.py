"""Fit the time model's efficiency parameters to measured op timings (least squares).

Records are single-device timings of one layer's pieces:
- ``gemm``: the linear part of a layer's forward over T tokens: ``time = a·F + c`` with
  F = linear FLOPs; ``gemm_max = 1/(a·peak)`` and ``gemm_half_tokens = c/(a·lin)`` (the fixed part of
  the affine GEMM time, see ``cost.model``).
- ``attention``: causal attention forward of one slice (c tokens after p):
  ``time = a·F + b·F/c + d``; ``attention_max = 1/(a·peak)``, ``attention_half_tokens = b/a``.
- ``layer``: a whole layer forward for a group; its residual over the fitted GEMM and attention
  terms is the per-layer overhead.
The fit error is reported as the mean and max absolute percentage error over all records.
Must not import torch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from slimpack.config import EfficiencyConfig, ModelConfig
from slimpack.cost import flops
from slimpack.errors import UserError
from slimpack.files import output_path, read_data_file

Op = Literal["gemm", "attention", "layer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingRecord:
    op: Op
    tokens: tuple[int, ...]
    """Tokens of each slice of the call (one entry for gemm/attention records)."""
    prefix: tuple[int, ...]
    """Prefix of each slice."""
    time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationResult:
    efficiency: EfficiencyConfig
    mape: float
    """Mean absolute percentage error of the fitted model over the records (0.05 = 5%)."""
    max_ape: float
    num_records: int

    def to_dict(self) -> dict:
        return {"efficiency": self.efficiency.to_dict(), "mape": self.mape, "max_ape": self.max_ape,
                "num_records": self.num_records}


def _attention_flops(model: ModelConfig, tokens: int, prefix: int) -> float:
    return flops.attention_flops_per_pair(model) * flops.attention_pairs(tokens, prefix)


def predict(record: TimingRecord, model: ModelConfig, peak_flops: float, eff: EfficiencyConfig) -> float:
    """The time model's prediction for a record (single device, tp = cp = 1)."""
    lin = flops.linear_flops_per_token(model)
    total = sum(record.tokens)
    gemm = lin * (total + eff.gemm_half_tokens) / (peak_flops * eff.gemm_max)
    attn = sum(_attention_flops(model, c, p) * (c + eff.attention_half_tokens) / c
               for c, p in zip(record.tokens, record.prefix, strict=True)) / (peak_flops * eff.attention_max)
    if record.op == "gemm":
        return gemm
    if record.op == "attention":
        return attn
    return gemm + attn + eff.layer_overhead_s


def _lstsq_nonneg(features: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares on relative error (rows scaled by 1/target), dropping negative coefficients."""
    weights = 1.0 / target
    active = list(range(features.shape[1]))
    while True:
        coef = np.zeros(features.shape[1])
        sol, *_ = np.linalg.lstsq(features[:, active] * weights[:, None], target * weights, rcond=None)
        coef[active] = sol
        negative = [i for i in active if coef[i] < 0]
        if not negative:
            return coef
        active.remove(min(negative, key=lambda i: coef[i]))


def fit_efficiency(records: list[TimingRecord], model: ModelConfig, peak_flops: float,
                   base: EfficiencyConfig | None = None) -> CalibrationResult:
    """Fit what the records determine; parameters without records keep ``base``'s values."""
    if not records:
        raise UserError("calibration needs at least one timing record")
    base = base or EfficiencyConfig()
    bad = [r for r in records if r.time_s <= 0 or not r.tokens or min(r.tokens) <= 0]
    if bad:
        raise UserError(f"calibration: {len(bad)} record(s) with non-positive time or tokens, e.g. {bad[0]}")
    lin = flops.linear_flops_per_token(model)
    changes: dict[str, float] = {}
    gemm = [r for r in records if r.op == "gemm"]
    if len(gemm) >= 2:
        f = np.array([lin * sum(r.tokens) for r in gemm], dtype=float)
        a, c = _lstsq_nonneg(np.stack([f, np.ones_like(f)], axis=1), np.array([r.time_s for r in gemm]))
        if a > 0:
            changes |= {"gemm_max": min(1.0, 1.0 / (a * peak_flops)), "gemm_half_tokens": c / (a * lin)}
    attention = [r for r in records if r.op == "attention"]
    if len(attention) >= 3:
        f = np.array([_attention_flops(model, r.tokens[0], r.prefix[0]) for r in attention])
        per_query = f / np.array([r.tokens[0] for r in attention], dtype=float)
        a, b, _ = _lstsq_nonneg(np.stack([f, per_query, np.ones_like(f)], axis=1),
                                np.array([r.time_s for r in attention]))
        if a > 0:
            forward = min(1.0, 1.0 / (a * peak_flops))
            backward = min(1.0, forward * base.attention_backward_max / base.attention_max)  # keep the ratio
            changes |= {"attention_max": forward, "attention_backward_max": backward,
                        "attention_half_tokens": b / a}
    eff = dataclasses.replace(base, kernels="calibrated", **changes)
    layers = [r for r in records if r.op == "layer"]
    if layers:
        # the measured layers' norms, RoPE and SwiGLU land in the fitted overhead, not charged again
        eff = dataclasses.replace(eff, elementwise_bandwidth=None)
        residual = [r.time_s - predict(dataclasses.replace(r, op="gemm"), model, peak_flops, eff)
                    - predict(dataclasses.replace(r, op="attention"), model, peak_flops, eff) for r in layers]
        eff = dataclasses.replace(eff, layer_overhead_s=max(0.0, float(np.median(residual))))
    errors = np.array([abs(predict(r, model, peak_flops, eff) - r.time_s) / r.time_s for r in records])
    return CalibrationResult(efficiency=eff, mape=float(errors.mean()), max_ape=float(errors.max()),
                             num_records=len(records))


def save_records(records: list[TimingRecord], path: str | Path) -> None:
    output_path(path).write_text(json.dumps([dataclasses.asdict(r) for r in records], indent=1) + "\n")


def load_records(path: str | Path) -> list[TimingRecord]:
    try:
        raw = json.loads(Path(path).read_text())
        return [TimingRecord(op=r["op"], tokens=tuple(r["tokens"]), prefix=tuple(r["prefix"]),
                             time_s=float(r["time_s"])) for r in raw]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserError(f"cannot read timing records from {path}: {exc}") from None


def save_calibration(result: CalibrationResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result.to_dict(), indent=2) + "\n")


def load_calibration(path: str | Path) -> EfficiencyConfig:
    data = read_data_file(path, "calibration")
    return EfficiencyConfig.from_dict(data.get("efficiency", data), where=str(path))
