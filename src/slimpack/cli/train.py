"""``slimpack train``: train a model for a few steps with a strategy's plans, one rank per
(replica, stage), on real text available offline (the CPython standard library, byte-level).

Run it under torchrun with pp x dp processes, e.g.
``torchrun --nproc-per-node 2 -m slimpack train --model tiny --pp 2 --dp 1 --steps 2``;
without torchrun it runs in this process when pp = dp = 1. Logs loss, tokens/s and the planner's
time per step (rank 0) and can write each rank's Chrome trace of the real run. Imports torch only
when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from slimpack.cli.common import (
    add_config_arguments,
    add_planner_arguments,
    config_from_args,
    positive_int,
)
from slimpack.config.defaults import RUNTIME_CONFIG
from slimpack.errors import UserError

HELP = "train a model on plans of a strategy over torch.distributed (torchrun; CPython stdlib text)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", default="slimpack", metavar="S", help="planning strategy (default slimpack)")
    parser.add_argument("--steps", type=positive_int, default=2, metavar="N", help="optimizer steps (default 2)")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--attention", choices=("auto", "cpu", "math", "flash", "torch"), default="auto",
                        help="attention backend (default auto)")
    parser.add_argument("--shuffle", action="store_true", help="visit documents in a seeded random order")
    parser.add_argument("--max-files", type=positive_int, metavar="N", help="use only the first N stdlib files")
    parser.add_argument("--no-plan-ahead", dest="plan_ahead", action="store_false",
                        help="plan each step when it starts instead of on a background thread")
    parser.add_argument("--trace-dir", metavar="DIR", help="write each rank's Chrome trace (rank<R>.json) here")
    parser.add_argument("--log-json", metavar="FILE", help="rank 0 writes per-step records (JSON) here")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help="a step (or a peer) slower than this aborts the job (default 300)")
    add_config_arguments(parser, default=RUNTIME_CONFIG)
    add_planner_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise UserError("slimpack train needs PyTorch: install slimpack[torch]") from None
    from slimpack.compare.run import check_strategies
    from slimpack.data.text import VOCAB_SIZE, TextCorpus
    from slimpack.runtime import distributed
    from slimpack.runtime.loader import PlanningLoader
    from slimpack.runtime.mesh import Mesh
    from slimpack.runtime.model import build_model
    from slimpack.sim.result import Span
    from slimpack.sim.trace import spans_trace

    check_strategies([args.strategy])
    config = config_from_args(args)
    par = config.parallel
    if par.tp != 1 or par.cp != 1:
        raise UserError(f"the runtime runs tp = cp = 1 (got tp={par.tp}, cp={par.cp}); merged CP pipelines "
                        f"run on their first replica")
    if config.model.vocab_size != VOCAB_SIZE:
        raise UserError(f"training text is byte-level (vocabulary {VOCAB_SIZE}); model {config.model.name} has "
                        f"{config.model.vocab_size}: use --model tiny or a config with vocab_size {VOCAB_SIZE}")
    needed = par.pp * par.dp
    if "WORLD_SIZE" not in os.environ:
        if needed != 1:
            raise UserError(f"pp={par.pp} x dp={par.dp} needs {needed} processes: run "
                            f"torchrun --nproc-per-node {needed} -m slimpack {' '.join(args.argv)}")
        rendezvous = tempfile.mkdtemp(prefix="slimpack-train-")
        import datetime

        dist.init_process_group("gloo", init_method=f"file://{rendezvous}/store", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=args.timeout))
    else:
        if int(os.environ["WORLD_SIZE"]) != needed:
            raise UserError(f"torchrun started {os.environ['WORLD_SIZE']} processes; pp={par.pp} x dp={par.dp} "
                            f"needs {needed}")
        distributed.init(timeout_s=args.timeout)
    rank = dist.get_rank()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    corpus = TextCorpus.stdlib(args.max_files)
    loader = PlanningLoader(corpus.dataset(), config, args.strategy, shuffle=args.shuffle, ahead=args.plan_ahead)
    model = build_model(config.model, seed=config.train.seed, dtype=dtype, device=device)
    runtime = distributed.RankRuntime(
        model, Mesh.from_parallel(par), virtual_stages=par.virtual_stages, stage_layers=par.stage_layers,
        backend=args.attention,
        optimizer=lambda params: torch.optim.AdamW(params, lr=args.lr), timeout_s=args.timeout)
    say = print if rank == 0 else (lambda *_a, **_k: None)
    say(f"slimpack train: {config.model.name} ({config.model.num_params():,} parameters, {args.dtype}) on "
        f"pp={par.pp} x dp={par.dp} ({needed} process(es), {dist.get_backend()}), strategy {args.strategy}, "
        f"{len(corpus.paths)} stdlib files as bytes, max_context {config.train.max_context}, "
        f"{config.train.global_batch_tokens} tokens per batch, planning {'ahead' if args.plan_ahead else 'inline'}",
        flush=True)
    spans: list[Span] = []
    records: list[dict[str, Any]] = []
    run_began = time.perf_counter()
    try:
        for _ in range(args.steps):
            waited = time.perf_counter()
            item = next(loader)
            wait_s = time.perf_counter() - waited
            max_context = config.train.max_context
            tokens = {sid: torch.frombuffer(bytearray(corpus.sample_tokens(s.doc_index, s.chunk, max_context,
                                                                           s.length)), dtype=torch.uint8).long()
                      for sid, s in item.sources.items()}
            began = time.perf_counter()
            result = runtime.step(item.plan, tokens)
            step_s = time.perf_counter() - began
            offset = began - run_began
            spans += [Span(s.pipeline, s.stage, s.kind, s.group, s.chunk, s.start_s + offset, s.end_s + offset,
                           s.tokens) for s in result.spans]
            num_tokens = sum(len(t) for t in tokens.values())
            record = {"step": item.step, "loss": result.loss, "step_time_s": step_s, "tokens": num_tokens,
                      "tokens_per_s": num_tokens / step_s, "planner_time_s": item.planner_time_s,
                      "plan_wait_s": wait_s, "deferred": len(item.plan.deferred)}
            records.append(record)
            say(f"step {item.step}: loss {result.loss:.4f}, {num_tokens} tokens in {step_s:.3f} s "
                f"({num_tokens / step_s:,.0f} tokens/s), planner {item.planner_time_s * 1e3:.1f} ms "
                f"(waited {wait_s * 1e3:.1f} ms for the plan)", flush=True)
    except distributed.PeerFailure as exc:
        raise UserError(str(exc)) from None
    finally:
        loader.close()
    if args.trace_dir:
        out = Path(args.trace_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"rank{rank}.json"
        path.write_text(json.dumps(spans_trace(spans, {"rank": rank, "strategy": args.strategy,
                                                       "steps": args.steps}), separators=(",", ":")) + "\n")
        say(f"traces: {out}/rank<R>.json (open in ui.perfetto.dev)")
    if rank == 0 and args.log_json:
        Path(args.log_json).write_text(json.dumps(records, indent=2) + "\n")
    dist.destroy_process_group()
    return 0
