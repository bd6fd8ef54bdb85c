"""Check a Plan's numerics: run it through the executors and through the reference, compare.

The plan's samples keep their lengths (tokens are tokens); only the model is swapped for a small
one (``tiny`` by default, or transformers' model of a Hugging Face config.json, whose reference is
its own unpacked forward: ``models``) so the check runs on a CPU. Tokens are random, drawn per sample from
(seed, sample id). Every pipeline of the plan runs on the same parameters, so gradients add up over
pipelines as data-parallel all-reduce would; the loss is normalised by the loss tokens of all of the
plan's (non-deferred) samples. Each pipeline runs in its per-stage ``order`` (which checks the order
too; a plan always carries one), or with ``use_order=False`` all forward groups, then all backward groups.

Errors: the loss's relative difference, and per parameter max|g − g_ref| / max|g_ref| (relative to
the largest reference entry, so entries near zero do not blow it up; floored at ``RELATIVE_FLOOR``
of the largest gradient entry of the model, for parameters whose true gradient is zero). With bf16
compute (``precision="bf16"``) the per-parameter relative L2 error, next to the unsliced bf16 run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from slimpack.config import ModelConfig, resolve_model
from slimpack.plan.types import Plan
from slimpack.runtime.loss import count_loss_tokens
from slimpack.runtime.models import build_runtime_model, reference_run, runs_transformers
from slimpack.runtime.pipeline import (
    build_executors,
    default_actions,
    run_in_order,
    run_stage_orders,
)
from slimpack.runtime.precision import MixedPrecision

DEFAULT_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
TRANSFORMERS_FLOAT64_TOLERANCE = 1e-6
"""float64 with transformers' model: its RMSNorm computes in float32 whatever the model's dtype. The
packed run and the unpacked one differ by ~1e-16 before a norm (other row counts, other sums), and
where that straddles a float32 rounding step the norm's output moves by one float32 ulp (6e-8): rare,
but then the gradients are ~1e-7 apart (CI drew such a case: qwen2, 9.6e-8). A wrong position, mask
or K/V prefix is orders of magnitude above this (``tests/runtime/test_hf_model.py``)."""
BF16_TOLERANCE = 5e-2
"""bf16 compute vs the float32 reference: the loss's relative error, and every gradient's relative L2
error unless the unsliced bf16 run is itself further off (``BF16_BASELINE_FACTOR``)."""
BF16_BASELINE_FACTOR = 1.25
"""A bf16 gradient also passes within this factor of the unsliced bf16 run's own error: how far bf16
moves a gradient depends on the model (a tiny random model with large weights: up to 33%), and
slicing must not add to it (docs/runtime.md has the measured values)."""


def default_tolerance(model: ModelConfig | str, dtype: torch.dtype, precision: str = "full") -> float:
    """The tolerance a check of ``model`` in ``dtype`` (and ``precision``) passes within."""
    if precision == "bf16":
        return BF16_TOLERANCE
    if dtype == torch.float64 and runs_transformers(model):
        return TRANSFORMERS_FLOAT64_TOLERANCE
    return DEFAULT_TOLERANCE[dtype]


# A parameter's error is relative to its largest reference gradient entry, but never to less than
# this fraction of the largest entry of any parameter: where a gradient is zero in exact arithmetic
# (Q/K weights when no sample has more than two tokens), both sides are pure roundoff.
RELATIVE_FLOOR = 1e-3


@dataclass(frozen=True, slots=True)
class ParamError:
    name: str
    numel: int
    max_abs_reference: float
    max_abs_error: float
    scale: float
    """The denominator: max(max_abs_reference, RELATIVE_FLOOR x the largest over all parameters)."""
    relative_l2: float = 0.0
    """‖g − g_ref‖ / ‖g_ref‖ (floored like ``scale``): the measure for bf16 compute, whose rounding
    moves single entries of small gradients by tens of percent in an unsliced run too."""

    @property
    def relative(self) -> float:
        return self.max_abs_error / self.scale if self.scale > 0 else self.max_abs_error


def gradient_errors(grads: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> list[ParamError]:
    """Per parameter: max|g − g_ref| relative to max|g_ref| (floored, see ``RELATIVE_FLOOR``)."""
    largest = {name: float(ref.abs().max()) if ref.numel() else 0.0 for name, ref in reference.items()}
    floor = RELATIVE_FLOOR * max(largest.values(), default=0.0)
    norms = {name: float(ref.norm()) for name, ref in reference.items()}
    norm_floor = RELATIVE_FLOOR * max(norms.values(), default=0.0)
    return [ParamError(name=name, numel=ref.numel(), max_abs_reference=largest[name],
                       max_abs_error=float((grads[name] - ref).abs().max()) if ref.numel() else 0.0,
                       scale=max(largest[name], floor),
                       relative_l2=float((grads[name] - ref).norm()) / max(norms[name], norm_floor, 1e-300))
            for name, ref in reference.items()]


@dataclass(frozen=True, slots=True)
class VerifyResult:
    model: ModelConfig
    dtype: str
    loss: float
    reference_loss: float
    params: tuple[ParamError, ...]
    num_samples: int
    num_tokens: int
    num_slices: int
    num_pipelines: int
    asymmetric_pipelines: int
    ordered_pipelines: int
    """Pipelines run in their plan's explicit per-stage order."""
    peak_activation_bytes: tuple[tuple[int, ...], ...] = ()
    """Per pipeline, per model chunk: peak bytes kept for backward (with ``track_memory``)."""
    precision: str = "full"
    baseline_grad_error: float = 0.0
    """bf16: the worst gradient's relative L2 error of the unsliced bf16 run vs float32."""

    @property
    def loss_error(self) -> float:
        return abs(self.loss - self.reference_loss) / max(abs(self.reference_loss), 1e-300)

    def param_error(self, param: ParamError) -> float:
        """A parameter's error: largest-entry relative in full precision, relative L2 in bf16."""
        return param.relative if self.precision == "full" else param.relative_l2

    @property
    def max_grad_error(self) -> float:
        return max((self.param_error(p) for p in self.params), default=0.0)

    def grad_tolerance(self, tolerance: float) -> float:
        return max(tolerance, BF16_BASELINE_FACTOR * self.baseline_grad_error)

    def passed(self, tolerance: float) -> bool:
        return self.loss_error <= tolerance and self.max_grad_error <= self.grad_tolerance(tolerance)


def random_tokens(lengths: Mapping[int, int], vocab_size: int, seed: int = 0,
                  device: torch.device | str = "cpu") -> dict[int, torch.Tensor]:
    """Token ids per sample, drawn from (seed, sample id): one sample's tokens do not depend on the
    others'."""
    return {sid: torch.from_numpy(np.random.default_rng([seed, sid]).integers(0, vocab_size, size=length))
            .to(device=device, dtype=torch.long) for sid, length in lengths.items()}


def numerics_model(model: ModelConfig | str, num_chunks: int, stage_layers: Sequence[int] = ()) -> ModelConfig:
    """The model to run: ``model`` with the plan's uneven split's layer count (``stage_layers``), or
    with its layer count raised to a multiple of the plan's chunks."""
    config = resolve_model(model) if isinstance(model, str) else model
    if stage_layers:
        config = dataclasses.replace(config, num_layers=sum(stage_layers))
    elif config.num_layers % num_chunks:
        layers = -(-config.num_layers // num_chunks) * num_chunks
        config = dataclasses.replace(config, num_layers=layers)
    return config


def plan_lengths(plan: Plan) -> dict[int, int]:
    """Lengths of the samples the plan's pipelines run (deferred samples excluded)."""
    lengths = plan.sample_lengths()
    used = {s.sample_id for pipe in plan.pipelines for group in pipe.forward for s in group}
    missing = sorted(used - set(lengths))
    if missing:
        raise ValueError(f"the plan's groups use sample(s) {missing[:5]} that are not in its samples")
    return {sid: lengths[sid] for sid in sorted(used)}


def _taken_grads(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient (zeros where none), taken off the parameters."""
    grads = {name: p.grad if p.grad is not None else torch.zeros_like(p) for name, p in net.named_parameters()}
    net.zero_grad(set_to_none=True)
    return grads


def verify_plan(plan: Plan, *, model: ModelConfig | str = "tiny", dtype: torch.dtype = torch.float64,
                seed: int = 0, backend: str = "auto", device: torch.device | str = "cpu",
                use_order: bool = True, track_memory: bool = False, precision: str = "full") -> VerifyResult:
    """Run ``plan`` through the executors and the reference on random tokens; compare.

    ``precision="bf16"``: the executors run a bf16 copy of the (float32, ``dtype``) model with
    float32 master gradients (``precision.MixedPrecision``); the reference runs the float32 model."""
    par = plan.config.parallel
    num_chunks = par.pp * par.virtual_stages
    config = numerics_model(model, num_chunks, par.stage_layers)
    lengths = plan_lengths(plan)
    tokens = random_tokens(lengths, config.vocab_size, seed, device)
    num_loss = count_loss_tokens(lengths.values())
    net = build_runtime_model(model, config, seed=seed, dtype=dtype, device=device)
    compute = net if precision == "full" else MixedPrecision(net).compute

    net.zero_grad(set_to_none=True)
    loss = torch.zeros((), dtype=torch.float64, device=device)
    peaks = []
    ordered = 0
    for pipe in plan.pipelines:
        executors = build_executors(compute, pipe, num_chunks=num_chunks, sample_lengths=lengths, tokens=tokens,
                                    num_loss_tokens=num_loss, backend=backend, track_memory=track_memory,
                                    stages_per_pipeline=par.pp, stage_layers=par.stage_layers)
        if use_order:
            loss = loss + run_stage_orders(executors, pipe.order).double()
            ordered += 1
        else:
            loss = loss + run_in_order(executors, default_actions(pipe)).double()
        if track_memory:
            peaks.append(tuple(e.tracker.peak_bytes for e in executors if e.tracker is not None))
    grads = _taken_grads(net)
    ref = reference_run(net, tokens, num_loss)
    ref_grads = _taken_grads(net)
    errors = gradient_errors(grads, ref_grads)
    baseline = 0.0
    if compute is not net:  # the unsliced run in bf16: what bf16 costs without slicing
        reference_run(compute, tokens, num_loss)
        baseline = max((e.relative_l2 for e in gradient_errors(_taken_grads(net), ref_grads)), default=0.0)
    dtype_name = str(dtype).removeprefix("torch.") + (f", {precision} compute" if precision != "full" else "")
    return VerifyResult(
        model=config, dtype=dtype_name, loss=float(loss), reference_loss=float(ref),
        params=tuple(errors), num_samples=len(lengths), num_tokens=sum(lengths.values()),
        num_slices=sum(len(g) for pipe in plan.pipelines for g in pipe.forward),
        num_pipelines=len(plan.pipelines), asymmetric_pipelines=sum(not p.symmetric for p in plan.pipelines),
        ordered_pipelines=ordered, peak_activation_bytes=tuple(peaks), precision=precision,
        baseline_grad_error=baseline)
