"""The training loop: one process per (replica, stage), plans from the planning-ahead loader, real text.

Read top to bottom: ``TrainOptions`` (what to run, validated before any work), ``Trainer.check``
(everything that can be refused before the process group starts), ``Trainer.run`` (bootstrap the
process group once, build the loader, model and rank runtime, run the steps, write the outputs).
The text is the CPython standard library as bytes (offline, byte-level vocabulary).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from slimpack.config import Config
from slimpack.config.defaults import PRECISIONS
from slimpack.data.text import VOCAB_SIZE, TextCorpus
from slimpack.errors import UserError
from slimpack.files import output_path
from slimpack.runtime import distributed
from slimpack.runtime.attention import resolve_backend
from slimpack.runtime.loader import PlanningLoader
from slimpack.runtime.mesh import Mesh
from slimpack.runtime.models import build_runtime_model, layer_ops
from slimpack.runtime.precision import MixedPrecision
from slimpack.runtime.tensor_parallel import check_sequence_parallel, check_tensor_parallel
from slimpack.runtime.waits import process_group_timeout
from slimpack.sim.result import Span
from slimpack.sim.trace import spans_trace
from slimpack.strategies.stream import PlannedStep

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainOptions:
    strategy: str = "slimpack"
    steps: int = 2
    """Optimizer steps."""
    lr: float = 1e-3
    """AdamW learning rate."""
    dtype: str = "float32"
    attention: str = "auto"
    """Attention backend (``runtime.attention.BACKENDS``)."""
    shuffle: bool = False
    max_files: int | None = None
    """Use only the first N standard-library files (None: all)."""
    plan_ahead: bool = True
    """Plan step t+1 on a background thread while step t runs."""
    trace_dir: str | None = None
    """Each rank writes its Chrome trace (rank<R>.json) here."""
    log_json: str | None = None
    """Rank 0 writes the per-step records (JSON) here."""
    timeout_s: float = 300.0
    """Any wait on another rank longer than this aborts the job (``runtime.waits``)."""
    hf_config: str | None = None
    """A Hugging Face config.json: train transformers' own model of that config (``hf_model``)."""
    precision: str = "full"
    """``full``: compute in ``dtype``; ``bf16``: bf16 compute, float32 master weights (``precision``)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"--lr must be a positive number, got {self.lr}")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise UserError(f"--timeout must be a positive number of seconds, got {self.timeout_s}")
        if self.steps < 1:
            raise UserError(f"--steps must be >= 1, got {self.steps}")
        if self.dtype not in DTYPES:
            raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.precision not in PRECISIONS:
            raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.precision == "bf16" and self.dtype != "float32":
            raise UserError("--precision bf16 keeps float32 master weights: use --dtype float32")

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.precision == "bf16" else DTYPES[self.dtype]


def world_size(config: Config) -> int:
    """Processes the layout needs: one per (tp rank, cp rank, replica, stage)."""
    return config.parallel.num_devices


def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def init_process_group(config: Config, timeout_s: float) -> None:
    """The one bootstrap: under torchrun, from its environment; alone (every degree 1), a one-process
    group on a file store, so the same rank code runs either way."""
    if "WORLD_SIZE" in os.environ:
        distributed.init(timeout_s=timeout_s)
    else:
        store = Path(tempfile.mkdtemp(prefix="slimpack-train-")) / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1,
                                timeout=process_group_timeout(timeout_s))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


class Trainer:
    """``Trainer(config, options).run()`` trains ``options.steps`` steps on this rank."""

    def __init__(self, config: Config, options: TrainOptions, *, argv: list[str] | None = None) -> None:
        self.config, self.options = config, options
        self.check(argv or [])

    def check(self, argv: list[str]) -> None:
        """Refuse what cannot run, before the process group or any work starts."""
        par, model = self.config.parallel, self.config.model
        ops = layer_ops(self.options.hf_config)
        if self.config.train.layer_ops != ops:
            raise UserError(f"the runtime runs {ops} layers here, but the config's layer_ops is "
                            f"{self.config.train.layer_ops!r}: its memory model would be for other layers")
        try:
            check_tensor_parallel(model, par.tp)
            check_sequence_parallel(self.config)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if model.vocab_size != VOCAB_SIZE:
            raise UserError(f"training text is byte-level (vocabulary {VOCAB_SIZE}); model {model.name} has "
                            f"{model.vocab_size}: use --model tiny or a config with vocab_size {VOCAB_SIZE}")
        needed, layout = world_size(self.config), Mesh.from_parallel(par)
        started = os.environ.get("WORLD_SIZE")
        if started is None and needed != 1:
            raise UserError(f"{layout} needs {needed} processes: run "
                            f"torchrun --nproc-per-node {needed} -m slimpack {' '.join(argv)}")
        if started is not None and int(started) != needed:
            raise UserError(f"torchrun started {started} processes; {layout} needs {needed}")
        try:
            resolve_backend(self.options.attention, device(), self.options.compute_dtype)
        except ValueError as exc:
            raise UserError(f"--attention: {exc}") from None

    def run(self) -> list[dict[str, Any]]:
        """Train; returns the per-step records (every rank computes them; rank 0 prints them). The
        process group is torn down however training ends, so a caller can train again."""
        init_process_group(self.config, self.options.timeout_s)
        try:
            return self._train()
        finally:
            dist.destroy_process_group()

    def _train(self) -> list[dict[str, Any]]:
        options, config = self.options, self.config
        say = print if dist.get_rank() == 0 else (lambda *_a, **_k: None)
        corpus = TextCorpus.stdlib(options.max_files)
        loader = PlanningLoader(corpus.dataset(), config, options.strategy, shuffle=options.shuffle,
                                ahead=options.plan_ahead)
        runtime = self._rank_runtime()
        say(self._banner(len(corpus.paths)), flush=True)
        spans: list[Span] = []
        records: list[dict[str, Any]] = []
        began = time.perf_counter()
        try:
            for _ in range(options.steps):
                records.append(self._step(loader, runtime, corpus, spans, began, say))
        except distributed.PeerFailure as exc:
            raise UserError(str(exc)) from None
        finally:
            loader.close()
            runtime.close()
        self._write_outputs(spans, records, say)
        return records

    def _rank_runtime(self) -> distributed.RankRuntime:
        par, options = self.config.parallel, self.options
        model = build_runtime_model(options.hf_config or self.config.model, self.config.model,
                                    seed=self.config.train.seed, dtype=DTYPES[options.dtype], device=device())
        precision = MixedPrecision(model) if options.precision == "bf16" else None
        return distributed.RankRuntime(
            model if precision is None else precision.compute, Mesh.from_parallel(par),
            virtual_stages=par.virtual_stages, stage_layers=par.stage_layers, backend=options.attention,
            optimizer=lambda params: torch.optim.AdamW(params, lr=options.lr), timeout_s=options.timeout_s,
            precision=precision)

    def _banner(self, num_files: int) -> str:
        config, options, par = self.config, self.options, self.config.parallel
        kind = "transformers' " if options.hf_config else ""
        precision = ", bf16 compute" if options.precision == "bf16" else ""
        return (f"slimpack train: {kind}{config.model.name} ({config.model.num_params():,} parameters, "
                f"{options.dtype}{precision}) "
                f"on {Mesh.from_parallel(par)} ({world_size(config)} process(es), {dist.get_backend()}), strategy "
                f"{options.strategy}, {num_files} stdlib files as bytes, max_context {config.train.max_context}, "
                f"{config.train.global_batch_tokens} tokens per batch, planning "
                f"{'ahead' if options.plan_ahead else 'inline'}")

    def _step(self, loader: PlanningLoader, runtime: distributed.RankRuntime, corpus: TextCorpus,
              spans: list[Span], run_began: float, say: Callable[..., None]) -> dict[str, Any]:
        """Take the next planned step, run it, keep its spans (on the run's clock) and log it."""
        waited = time.perf_counter()
        item: PlannedStep = next(loader)
        wait_s = time.perf_counter() - waited
        tokens = self._tokens(item, corpus)
        began = time.perf_counter()
        result = runtime.step(item.plan, tokens)
        step_s = time.perf_counter() - began
        offset = began - run_began
        spans += [Span(s.pipeline, s.stage, s.kind, s.group, s.chunk, s.start_s + offset, s.end_s + offset, s.tokens)
                  for s in result.spans]
        num_tokens = sum(len(t) for t in tokens.values())
        say(f"step {item.step}: loss {result.loss:.4f}, {num_tokens} tokens in {step_s:.3f} s "
            f"({num_tokens / step_s:,.0f} tokens/s), planner {item.planner_time_s * 1e3:.1f} ms "
            f"(waited {wait_s * 1e3:.1f} ms for the plan)", flush=True)
        return {"step": item.step, "loss": result.loss, "step_time_s": step_s, "tokens": num_tokens,
                "tokens_per_s": num_tokens / step_s, "planner_time_s": item.planner_time_s,
                "plan_wait_s": wait_s, "deferred": len(item.plan.deferred)}

    def _tokens(self, item: PlannedStep, corpus: TextCorpus) -> dict[int, torch.Tensor]:
        """The byte tokens of every sample the step trains, by plan sample id."""
        context = self.config.train.max_context
        untraced = [s.id for s in item.trained if s.id not in item.sources]
        if untraced:  # fixed cuts documents at sequence boundaries into pieces with no source text
            raise UserError(f"strategy {self.options.strategy} made samples {untraced[:3]} that are not in the "
                            f"data stream (pieces of cut documents): train cannot give them text; --cut-documents "
                            f"cuts the documents in the data stream instead, for every strategy")
        return {sid: torch.frombuffer(bytearray(corpus.sample_tokens(s, context)),
                                      dtype=torch.uint8).long()
                for sid, s in item.sources.items()}

    def _write_outputs(self, spans: list[Span], records: list[dict[str, Any]], say: Callable[..., None]) -> None:
        rank = dist.get_rank()
        if self.options.trace_dir:
            out = Path(self.options.trace_dir)
            out.mkdir(parents=True, exist_ok=True)
            meta = {"rank": rank, "strategy": self.options.strategy, "steps": self.options.steps}
            (out / f"rank{rank}.json").write_text(json.dumps(spans_trace(spans, meta), separators=(",", ":")) + "\n")
            say(f"traces: {out}/rank<R>.json (open in ui.perfetto.dev)")
        if rank == 0 and self.options.log_json:
            output_path(self.options.log_json).write_text(json.dumps(records, indent=2) + "\n")
