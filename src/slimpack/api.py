"""slimpack's Python API: the jobs of the ``slimpack`` commands as functions of values.

::

    from slimpack import api

    config = api.configure(model="llama3-8b", tp=8, pp=4, dp=4, max_context=128 * 1024)
    plan = api.plan_batch([90_000, 4_000, 1_200, 30_000], config, "slimpack")
    print(api.simulate(plan).step_time_s)
    comparison = api.compare("wikipedia", config, ["kk", "slimpack"], warmup=2, steps=8)

Each function is a thin front for the module that does the work (the CLI calls the same ones), so
the API and the commands cannot drift apart. Documented with examples in docs/api.md.

Must not import torch (framework adapters that need it live in ``slimpack.integrations``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from slimpack.compare.run import (
    DEFAULT_WARMUP_STEPS,
    DEFAULT_WINDOW_STEPS,
    Comparison,
    Window,
    check_strategies,
)
from slimpack.compare.run import compare as _compare
from slimpack.config import Config, load_config, resolve_model, save_config
from slimpack.config.overrides import configure as _configure
from slimpack.config.overrides import starting_config
from slimpack.cost import CostModel
from slimpack.cost.stages import balanced_stage_layers
from slimpack.data import ContextCut, Dataset, context_cut, load_dataset
from slimpack.errors import UserError
from slimpack.plan import Plan, load_plan, save_plan
from slimpack.plan.check import check_plan
from slimpack.plan.types import Sample
from slimpack.sim import SimResult, simulate
from slimpack.strategies import STRATEGIES, make_planner
from slimpack.strategies.stream import PlannedStep, PlanStream, stream_batches
from slimpack.tune import TuneResult
from slimpack.tune import tune as _tune
from slimpack.tune.search import CONFIRM

DatasetLike = Dataset | str
"""A :class:`~slimpack.data.Dataset`, a bundled name (``"wikipedia"``), ``"synthetic:..."`` or the
path of a length file (.csv .txt .jsonl .npy .npz .parquet)."""


def configure(base: Config | str | None = None, *, stage_layers: Sequence[int] | str | None = None,
              **changes: Any) -> Config:
    """``base`` with the values given replaced (``slimpack.config.overrides.configure``: the model,
    GPU, layout, training step, kernels and planner fields), where ``stage_layers``, the layers of
    each pipeline chunk, may also be ``"even"`` or ``"balanced"``: the split
    ``balanced_stage_layers`` proposes for context-length samples on the layout's pp and virtual
    stages, which exists also where the layers do not divide evenly (``balance_stages`` weighs it
    by a dataset's batch instead)."""
    if not isinstance(stage_layers, str):
        return _configure(base, stage_layers=stage_layers, **changes)
    if stage_layers not in ("even", "balanced"):
        raise UserError(f"stage layers: expected layers per pipeline chunk, 'even' or 'balanced', got {stage_layers!r}")
    if stage_layers == "even":
        return _configure(base, stage_layers=(), **changes)
    start = starting_config(base)
    pp, vpp = changes.get("pp") or start.parallel.pp, changes.get("vpp") or start.parallel.virtual_stages
    flat = _configure(start, **{**changes, "pp": 1, "vpp": 1}, stage_layers=())  # any layer count fits one stage
    return _configure(start, stage_layers=balanced_stage_layers(flat, pp=pp, virtual_stages=vpp), **changes)


def balance_stages(config: Config, data: DatasetLike) -> Config:
    """``config`` with the stage split that evens out the stages' work on the first batch of
    ``data``'s step stream, the weighting ``slimpack tune`` uses (one context-length sample, as
    ``configure(stage_layers="balanced")`` weighs it, makes attention weigh more than it does in a
    batch of mostly short documents, and the LM head less)."""
    lengths = [sample.length for sample in stream_batches(dataset(data), config, 1)[0]]
    split = balanced_stage_layers(config, lengths)
    return dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, stage_layers=split))


def dataset(name_or_path: DatasetLike, *, column: str | None = None) -> Dataset:
    """Lengths to plan from (``column``: the CSV/Parquet column or JSONL key of a file)."""
    return name_or_path if isinstance(name_or_path, Dataset) else load_dataset(name_or_path, column=column)


def cut_at_context(data: DatasetLike, config: Config) -> ContextCut:
    """How many of the documents are longer than the config's context (cut into chunks)."""
    return context_cut(dataset(data).lengths, config.train.max_context)


def plan_batch(lengths: Sequence[int], config: Config, strategy: str = "slimpack", *, step: int = 0) -> Plan:
    """Plan one global batch: sample ``i`` has ``lengths[i]`` tokens (at most the context; cut longer
    documents first, or plan from a dataset with :func:`plan_step`, which does)."""
    check_strategies([strategy])
    too_long = [n for n in lengths if n > config.train.max_context]
    if too_long:
        raise UserError(f"{len(too_long)} length(s) exceed the {config.train.max_context}-token context "
                        f"(longest {max(too_long)}): cut documents to the context first")
    if not lengths:
        raise UserError("plan_batch needs at least one length")
    CostModel(config).check_states_fit()
    plan = make_planner(strategy, config).plan(
        [Sample(id=i, length=int(n), arrival_step=step) for i, n in enumerate(lengths)], step=step)
    check_plan(plan)
    return plan


def plan_step(data: DatasetLike, config: Config, strategy: str = "slimpack", *, step: int = 0,
              shuffle: bool = False) -> PlannedStep:
    """Plan step ``step`` of a dataset's batch stream, as ``slimpack plan`` does (documents longer than
    the context cut into chunks; a strategy that holds samples back replays the steps before)."""
    check_strategies([strategy])
    CostModel(config).check_states_fit()
    planned = next(PlanStream(dataset(data), config, strategy, shuffle=shuffle, start=step))
    check_plan(planned.plan)
    return planned


def compare(data: DatasetLike, config: Config, strategies: Sequence[str] | None = None, *,
            warmup: int = DEFAULT_WARMUP_STEPS, steps: int = DEFAULT_WINDOW_STEPS, shuffle: bool = False,
            on_step: Callable[[], None] = lambda: None) -> Comparison:
    """Every strategy (default all) over the same consecutive steps, as ``slimpack compare``: ``warmup``
    unmeasured steps, then a measured window of ``steps``; ``.table()`` gives one row per strategy."""
    return _compare(config, dataset(data), list(strategies or STRATEGIES), Window(warmup_steps=warmup, steps=steps),
                    shuffle=shuffle, on_step=on_step)


def tune(data: DatasetLike, config: Config, gpus: int, strategies: Sequence[str] | None = None, *,
         screen_steps: int = 1, confirm: int = CONFIRM, warmup: int = DEFAULT_WARMUP_STEPS,
         steps: int = DEFAULT_WINDOW_STEPS, workers: int = 1, time_limit_s: float | None = None) -> TuneResult:
    """Each strategy's best layout of ``gpus`` GPUs (``config`` gives model, cluster, context, batch and
    planner; its layout and recomputation are searched), as ``slimpack tune``: layouts screened over
    ``screen_steps``, up to ``confirm`` front runners per strategy re-run over ``warmup`` steps and a
    window of ``steps``, ending in about ``time_limit_s`` seconds where given (as ``--time-limit``);
    ``.best_config()``."""
    return _tune(config, dataset(data), gpus, list(strategies or STRATEGIES), screen_steps=screen_steps,
                 confirm=confirm, window=Window(warmup_steps=warmup, steps=steps), workers=workers,
                 time_limit_s=time_limit_s)


__all__ = ["STRATEGIES", "Comparison", "Config", "ContextCut", "Dataset", "Plan", "PlannedStep", "SimResult",
           "TuneResult", "balance_stages", "check_plan", "compare", "configure", "cut_at_context", "dataset", "load_config",
           "load_plan", "plan_batch", "plan_step", "resolve_model", "save_config", "save_plan", "simulate", "tune"]
