"""Stress sweep (issue 12): SlimPack against every baseline over seeded random regimes, far outside
the matrix's 64K tokens per GPU, written to docs/stress.md.

Each cell draws a dataset, a model (llama2-7b/70b, llama3-8b, qwen2.5-7b), a context (8K-256K), the
tokens per GPU per step (16K-512K) and a layout (tp 1-8, pp 1-8, vpp 1-2, cp 1-4, dp 1-4, recompute
none/selective/full) from a seeded generator; layouts whose model states do not fit, or whose batch
is too large to plan on a laptop core, are redrawn. Every strategy plans and simulates one step of
the same batch (simulated, the default uncalibrated H100 cost model). Per cell: each strategy's
tokens/s and OOM, SlimPack's tokens/s over the best baseline's, and SlimPack's step over the layout's
lower bound: the max over devices of the device's simulated work, plus the fill before its first
forward and the drain after its last backward (the first forward and the last backward group on the
stages before it) and the gradient sync and optimizer step after it.

The baselines that cut documents (fixed, SlimPipe) train the pieces Megatron's fixed-length cut
makes of the batch, so less attention than SlimPack on whole documents. For a like-for-like
comparison with them each cell also has SlimPack planning those same pieces (``slimpack_on_pieces``).

    python benchmarks/stress.py --cells 200 --part 0/2       # resumable, in parts; cells in docs/stress/
    python benchmarks/stress.py --cells 200 --rerun slimpack # a strategy again at this commit (after work on it)
    python benchmarks/stress.py --cells 200 --pieces         # SlimPack on the fixed-length pieces, at this commit
    python benchmarks/stress.py --cells 200 --report         # -> docs/stress.md
    python benchmarks/stress.py --cells 200 --cut-documents --out docs/stress-cut  # every strategy on the pieces

``--wide`` draws from a wider space than the sweep's, for probes outside its band (results kept
apart with ``--out``/``--doc``): every model preset of 7B and up (``--models`` names others), the H100, H200 and A100-80G
presets, synthetic corpora (``slimpack.data.synthetic``: median 128-32K tokens, lognormal sigma
0.5-2, a Pareto tail of 0-50% with shape 0.5-2, cut at the context or twice it) beside the bundled
ones, contexts 4K-512K, 8K-1M tokens per GPU, pp up to 16, vpp up to 4, cp up to 8, dp up to 16.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from slimpack.compare.run import Window, run_strategy
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.data import bundled_datasets, load_dataset
from slimpack.errors import UserError
from slimpack.sim import SimResult, simulate
from slimpack.strategies import CUTS_DOCUMENTS, STRATEGIES, make_planner
from slimpack.strategies.fixed import pack_fixed_length
from slimpack.strategies.stream import stream_batches

MODELS = ("llama2-7b", "llama2-70b", "llama3-8b", "qwen2.5-7b")
CONTEXTS = (8192, 16384, 32768, 65536, 131072, 262144)
TOKENS_PER_GPU = (16384, 32768, 65536, 131072, 262144, 524288)
MAX_BATCH_TOKENS = 8 * 2**20
"""Cells whose global batch exceeds this are redrawn: planning every strategy on bigger batches
takes minutes per cell on one core."""
BASELINES = tuple(name for name in STRATEGIES if name != "slimpack")
WHOLE_DOCUMENT = tuple(name for name in BASELINES if name not in CUTS_DOCUMENTS)
"""Baselines that train every document whole, as SlimPack does (bfd, kk, wlb, bytescale)."""
CUTTING = tuple(name for name in BASELINES if name in CUTS_DOCUMENTS)
"""Baselines that train the pieces of a fixed-length cut (fixed, slimpipe)."""


def draw_cell(seed: int, index: int, contexts: tuple[int, ...] = CONTEXTS) -> dict:
    """The cell's settings: a pure function of (seed, index) (and the contexts drawn from)."""
    rng = random.Random(seed * 1_000_003 + index)
    return _redrawn(lambda: {
        "index": index, "dataset": rng.choice(bundled_datasets()), "model": rng.choice(MODELS),
        "context": rng.choice(contexts), "tokens_per_gpu": rng.choice(TOKENS_PER_GPU),
        "tp": rng.choice((1, 2, 4, 8)), "pp": rng.choice((1, 2, 4, 8)), "vpp": rng.choice((1, 1, 2)),
        "cp": rng.choice((1, 1, 2, 4)), "dp": rng.choice((1, 2, 4)),
        "recompute": rng.choice(("none", "selective", "full"))})


WIDE_MODELS = ("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "qwen2.5-7b", "qwen2.5-32b",
               "qwen2.5-72b")
WIDE_GPUS = ("h100-sxm", "h200", "a100-80g")


def draw_wide_cell(seed: int, index: int, models: tuple[str, ...] = WIDE_MODELS) -> dict:
    """A cell of the ``--wide`` space (see the module docstring): a pure function of (seed, index)
    and the models drawn from."""
    rng = random.Random(seed * 7919 + index)

    def draw() -> dict:
        context = rng.choice((4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288))
        dataset = rng.choice(bundled_datasets())
        if rng.random() < 0.45:
            dataset = (f"synthetic:count=60000,median={rng.choice((128, 512, 2048, 8192, 32768))},"
                       f"sigma={rng.choice((0.5, 1.0, 2.0))},tail_share={rng.choice((0.0, 0.02, 0.2, 0.5))},"
                       f"tail_alpha={rng.choice((0.5, 1.1, 2.0))},max_length={context * rng.choice((1, 2))},"
                       f"seed={rng.randrange(1000)}")
        return {"index": index, "dataset": dataset, "model": rng.choice(models), "gpu": rng.choice(WIDE_GPUS),
                "context": context, "tokens_per_gpu": rng.choice((8192, *TOKENS_PER_GPU, 2**20)),
                "tp": rng.choice((1, 2, 4, 8)), "pp": rng.choice((1, 2, 4, 8, 16)), "vpp": rng.choice((1, 1, 2, 3, 4)),
                "cp": rng.choice((1, 1, 2, 4, 8)), "dp": rng.choice((1, 2, 4, 8, 16)),
                "recompute": rng.choice(("none", "selective", "full"))}

    return _redrawn(draw)


def _redrawn(draw: Callable[[], dict]) -> dict:
    """``draw()`` again until its cell's model states fit and its batch is small enough to plan on a
    laptop core (vpp set to 1 without a pipeline)."""
    while True:
        cell = draw()
        if cell["pp"] == 1:
            cell["vpp"] = 1
        try:
            config = cell_config(cell)
            CostModel(config).check_states_fit()
        except (UserError, ValueError):
            continue
        if config.train.global_batch_tokens <= MAX_BATCH_TOKENS:
            return cell


def cell_config(cell: dict):
    parallel = ParallelConfig(tp=cell["tp"], pp=cell["pp"], dp=cell["dp"], cp=cell["cp"],
                              virtual_stages=cell["vpp"])
    batch = max(cell["tokens_per_gpu"] * parallel.num_devices, cell["context"])
    return build_config(model=cell["model"], gpu=cell.get("gpu", "h100-sxm"), parallel=parallel,
                        train=TrainConfig(max_context=cell["context"], global_batch_tokens=batch,
                                          recompute=cell["recompute"],
                                          cut_documents=cell.get("cut_documents", False)))


def lower_bound_s(result: SimResult) -> float:
    """Max over devices of: fill (first forward group on the stages before it) + the device's work
    + drain (last backward group on the stages before it) + its stage's gradient sync and optimizer."""
    work: dict[tuple[int, int], float] = {}
    first_forward: dict[tuple[int, int], float] = {}
    last_backward: dict[tuple[int, int], tuple[float, float]] = {}
    after: dict[int, float] = {}
    for span in result.spans:
        key = (span.pipeline, span.stage)
        length = span.end_s - span.start_s
        if span.kind in ("sync", "optim"):
            if span.pipeline == 0:  # every pipeline's stage runs the same sync and optimizer step
                after[span.stage] = after.get(span.stage, 0.0) + length
            continue
        work[key] = work.get(key, 0.0) + length
        if span.kind == "F" and span.group == 0 and span.chunk == 0:
            first_forward[key] = length
        if span.kind == "B" and (key not in last_backward or span.end_s > last_backward[key][0]):
            last_backward[key] = (span.end_s, length)
    bound = 0.0
    for (pipe, device), busy in work.items():
        fill = sum(first_forward.get((pipe, d), 0.0) for d in range(device))
        drain = sum(last_backward.get((pipe, d), (0.0, 0.0))[1] for d in range(device))
        bound = max(bound, fill + busy + drain + after.get(device, 0.0))
    return bound


def run_strategy_in_cell(name: str, config, dataset) -> dict:
    """One strategy's record in a cell (SlimPack's with its step, lower bound and winning candidate).
    The cell is one step; a deferring strategy's drain is counted, so every strategy trains the same tokens."""
    run = run_strategy(name, config, dataset, Window(warmup_steps=0, steps=1))
    row = run.metrics()
    record = {"tokens_per_s": row.tokens_per_s_with_drain, "oom": bool(row.oom_steps),
              "failed": bool(row.failed_steps), "errors": list(row.errors),
              "planner_s": row.planner_time_p50_s}
    first = run.steps[0].result
    # Device-seconds of forward and backward compute over every step that ran (the drain included):
    # a strategy that cuts documents does less attention on the same tokens, and this shows it.
    record["work_s"] = sum(_work_s(step.result, config) for step in run.steps if step.result is not None)
    if name == "slimpack" and first is not None:
        record["step_s"] = first.step_time_s
        record["lower_bound_s"] = lower_bound_s(first)
        plan = run.plans[0]
        record["candidate"] = plan.info.get("candidate") if plan is not None else None
    return record


def _work_s(result: SimResult, config) -> float:
    """Device-seconds of forward and backward compute: the simulator's work per stage device, over
    every stage of every replica (a pipeline on k merged replicas counts k times: summing its spans
    alone undercounted SlimPack's merged plans by that factor until the nineteenth session)."""
    return result.work_time_s * config.parallel.pp * config.parallel.dp


def _documents_and_pieces(config, dataset) -> tuple[list, list]:
    """A cell's batch (its first step) and the pieces the fixed-length cut makes of it
    (``fixed.pack_fixed_length``): what SlimPack trains and what the cutting baselines train."""
    documents = stream_batches(dataset, config, 1)[0]
    pieces, _ = pack_fixed_length(documents, config.train.max_context)
    return documents, pieces


def slimpack_on_pieces(config, dataset) -> dict:
    """SlimPack's record (one step) planning the pieces the fixed-length cut makes of the cell's batch
    (``fixed.pack_fixed_length``): the samples fixed and SlimPipe train, so the same attention work."""
    _, pieces = _documents_and_pieces(config, dataset)
    try:
        result = simulate(make_planner("slimpack", config).plan(pieces, step=0))
    except UserError as exc:
        return {"tokens_per_s": 0.0, "oom": False, "failed": True, "errors": [str(exc)]}
    return {"tokens_per_s": sum(p.length for p in pieces) / result.step_time_s, "oom": result.oom,
            "failed": False, "errors": [], "work_s": _work_s(result, config)}


def run_cell(cell: dict) -> dict:
    config = cell_config(cell)
    dataset = load_dataset(cell["dataset"])
    out = dict(cell, gpus=config.parallel.num_devices, batch_tokens=config.train.global_batch_tokens,
               samples=len(stream_batches(dataset, config, 1)[0]), strategies={})
    began = time.perf_counter()
    for name in STRATEGIES:
        out["strategies"][name] = run_strategy_in_cell(name, config, dataset)
    out["seconds"] = time.perf_counter() - began
    # a --cut-documents cell's batch is the pieces already: SlimPack's own record is its record on them
    out["slimpack_on_pieces"] = (out["strategies"]["slimpack"] if config.train.cut_documents
                                 else slimpack_on_pieces(config, dataset))
    return out


def rerun(cell: dict, name: str, commit: str) -> dict:
    """The cell with strategy ``name`` run again by this checkout (the others' records kept)."""
    cell["strategies"][name] = run_strategy_in_cell(name, cell_config(cell), load_dataset(cell["dataset"]))
    cell.setdefault("rerun", {})[name] = commit
    return cell


def _update_finished(out: Path, indices: list[int], updated_at: Callable[[dict], str | None],
                     update: Callable[[dict, str], str]) -> None:
    """Apply ``update`` (it says what changed) to every finished cell of ``indices`` that this
    checkout's commit has not updated yet (``updated_at``: the commit that last did)."""
    commit = head_commit()
    for index in indices:
        path = out / f"cell-{index:04d}.json"
        if not path.exists():
            continue
        cell = json.loads(path.read_text())
        if updated_at(cell) == commit:
            continue
        line = update(cell, commit)
        path.write_text(json.dumps(cell))
        print(f"cell {index}: {line}", flush=True)


def _strategy_again(cell: dict, name: str, commit: str) -> str:
    before = cell["strategies"][name]
    after = rerun(cell, name, commit)["strategies"][name]
    return (f"{name} {before['tokens_per_s']:,.0f} -> {after['tokens_per_s']:,.0f} tok/s, "
            f"OOM {before['oom']} -> {after['oom']}")


def _pieces_again(cell: dict, commit: str) -> str:
    record = slimpack_on_pieces(cell_config(cell), load_dataset(cell["dataset"]))
    cell["slimpack_on_pieces"] = record | {"commit": commit}
    cutting = _best_fitting(cell, CUTTING)
    return (f"SlimPack on the pieces {record['tokens_per_s']:,.0f} tok/s, best cutting baseline "
            f"{f'{cutting[0]} {cutting[1]:,.0f}' if cutting else 'none fits'}")


def head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip() or "unknown"


def _best_fitting(cell: dict, names: tuple[str, ...]) -> tuple[str, float] | None:
    fitting = {b: cell["strategies"][b]["tokens_per_s"] for b in names
               if not cell["strategies"][b]["oom"] and not cell["strategies"][b]["failed"]}
    if not fitting:
        return None
    best = max(fitting, key=lambda b: (fitting[b], b))
    return best, fitting[best]


def _slimpack_ok(cell: dict, key: str = "slimpack") -> bool:
    slim = _slimpack(cell, key)
    return not slim["oom"] and not slim["failed"]


def _slimpack(cell: dict, key: str) -> dict:
    """SlimPack's record: ``slimpack`` (whole documents) or ``slimpack_on_pieces``."""
    return cell["strategies"]["slimpack"] if key == "slimpack" else cell[key]


def summarize(cells: list[dict], names: tuple[str, ...] = BASELINES, key: str = "slimpack") -> dict:
    """The acceptance figures of issue 12 over the cells, against the best of ``names``: SlimPack
    on whole documents, or (``key``) on the fixed-length pieces, where a cell has that record."""
    cells = [c for c in cells if key == "slimpack" or key in c]
    ratios, bounds, oom_where_baseline_fits, baseline_none = [], [], [], 0
    for cell in cells:
        slim = _slimpack(cell, key)
        best = _best_fitting(cell, names)
        ok = _slimpack_ok(cell, key)
        if best and not ok:
            oom_where_baseline_fits.append(cell["index"])
        if not best:
            baseline_none += 1
        elif ok:
            ratios.append((slim["tokens_per_s"] / best[1], cell["index"]))
        if ok and slim.get("lower_bound_s"):
            bounds.append(slim["step_s"] / slim["lower_bound_s"])
    values = sorted(r for r, _ in ratios)
    bounds.sort()
    return {
        "cells": len(cells), "no_baseline_fits": baseline_none,
        "slimpack_oom_or_failed_where_a_baseline_fits": oom_where_baseline_fits,
        "compared": len(values),
        "at_least_best_baseline": sum(r >= 1 - 1e-9 for r in values),
        "below_0.97": sorted(i for r, i in ratios if r < 0.97),
        "ratio_min": values[0] if values else None, "ratio_median": statistics.median(values) if values else None,
        "step_over_lower_bound_median": statistics.median(bounds) if bounds else None,
        "step_over_lower_bound_p5_worst": bounds[min(len(bounds) - 1, round(0.95 * (len(bounds) - 1)))] if bounds else None,
    }


def _pieces_over_cutting(cell: dict) -> float | None:
    """SlimPack on the pieces over the best cutting baseline (None: no record, or none of them
    fits; 0.0 where SlimPack fails on the pieces and one of them fits)."""
    cutting = _best_fitting(cell, CUTTING)
    if "slimpack_on_pieces" not in cell or not cutting:
        return None
    return cell["slimpack_on_pieces"]["tokens_per_s"] / cutting[1] if _slimpack_ok(cell, "slimpack_on_pieces") else 0.0


def like_for_like(cells: list[dict]) -> list[tuple[float, int]]:
    """Per cell with the pieces' record where SlimPack fits and some baseline fits: SlimPack's worst
    ratio to the best baseline on the same work (the best whole-document baseline on the documents,
    the best cutting one on the pieces; a ratio of 0 where SlimPack fails on the pieces and a cutting
    baseline fits), and the cell's index."""
    worst = []
    for cell in cells:
        if "slimpack_on_pieces" not in cell or not _slimpack_ok(cell) or not _best_fitting(cell, BASELINES):
            continue
        whole, on_pieces = _best_fitting(cell, WHOLE_DOCUMENT), _pieces_over_cutting(cell)
        ratios = [cell["strategies"]["slimpack"]["tokens_per_s"] / whole[1]] if whole else []
        worst.append((min(ratios + ([on_pieces] if on_pieces is not None else [])), cell["index"]))
    return worst


def trained_work_s(cell: dict) -> dict[str, float]:
    """Whole-document seconds (``CostModel.whole_document_seconds``: no plan, no overheads) of what the
    cell's step trains: the documents (SlimPack and the whole-document baselines) and the pieces of
    their fixed-length cut (the cutting baselines). A property of the batch, not of any plan: the
    pieces' figure is lower by the attention a cut-off piece no longer pays to its document's earlier
    tokens, and equal where nothing is cut."""
    config = cell_config(cell)
    documents, pieces = _documents_and_pieces(config, load_dataset(cell["dataset"]))
    cost = CostModel(config)
    return {"documents": cost.whole_document_seconds([s.length for s in documents]),
            "pieces": cost.whole_document_seconds([p.length for p in pieces])}


def trained_work_ratio(name: str, work: dict[str, float]) -> float:
    """What ``name`` trains over what SlimPack trains (both on whole documents' terms)."""
    return work["pieces" if name in CUTTING else "documents"] / work["documents"]


class Behind(NamedTuple):
    """A cell where SlimPack is below the best baseline. A baseline that cuts documents trains less
    work on the same tokens, so it can win on tokens/s while training less work per second."""

    index: int
    baseline: str
    trained_work_ratio: float
    """What the baseline trains over what SlimPack trains (``trained_work_ratio``)."""
    work_rate_ratio: float
    """SlimPack's trained work per second over the baseline's."""


def behind_best_baseline(cells: list[dict], works: dict[int, dict[str, float]]) -> list[Behind]:
    """The cells where SlimPack is below the best baseline (``works``: ``trained_work_s`` per cell)."""
    rows = []
    for cell in cells:
        best = _best_fitting(cell, BASELINES)
        slim = cell["strategies"]["slimpack"]
        if not best or not _slimpack_ok(cell) or slim["tokens_per_s"] >= best[1]:
            continue
        ratio = trained_work_ratio(best[0], works[cell["index"]])
        rows.append(Behind(cell["index"], best[0], ratio, slim["tokens_per_s"] / (best[1] * ratio)))
    return rows


def work_rate_ratios(cells: list[dict], works: dict[int, dict[str, float]]) -> list[tuple[float, int]]:
    """Per cell where SlimPack and some baseline fit: SlimPack's trained work per second over the
    best baseline's on that basis (``trained_work_ratio``: a cutting baseline is credited with the
    pieces' whole-document work, not the documents'), with the cell's index."""
    ratios = []
    for cell in cells:
        rates = [best[1] * trained_work_ratio(name, works[cell["index"]])
                 for name in BASELINES if (best := _best_fitting(cell, (name,))) is not None]
        if rates and _slimpack_ok(cell):
            ratios.append((cell["strategies"]["slimpack"]["tokens_per_s"] / max(rates), cell["index"]))
    return ratios


def _work_ratio(cell: dict, name: str) -> float | None:
    """``name``'s compute device-seconds over SlimPack's (None when not recorded)."""
    slim, other = cell["strategies"]["slimpack"], cell["strategies"][name]
    return other["work_s"] / slim["work_s"] if slim.get("work_s") and "work_s" in other else None


def report(cells: list[dict], command: str) -> str:
    lines = [
        "# Stress sweep: SlimPack against every baseline over random regimes (issue 12)", "",
        "Simulated with the default (uncalibrated) cost model of the cell's GPU preset (H100 unless the model "
        "column names another), one step per cell, every strategy on the same batch. Cells are drawn by `benchmarks/stress.py` (see its docstring for the ranges).", "",
        f"Reproduce: `{command}` (then `--report`).", ""]
    commits = sorted({c.get("commit", "?") for c in cells})
    lines += [f"Every strategy ran at commit(s) {', '.join(commits)}."]
    for name in sorted({n for c in cells for n in c.get("rerun", {})}):
        again = sorted({c.get("rerun", {}).get(name, c.get("commit", "?")) for c in cells})
        lines += [f"{name} ran again (`--rerun {name}`) at {', '.join(again)}."]
    on_pieces = [c for c in cells if "slimpack_on_pieces" in c]
    if on_pieces:
        commits = sorted({c["slimpack_on_pieces"].get("commit", c.get("commit", "?")) for c in on_pieces})
        lines += [f"SlimPack on the fixed-length pieces (`--pieces`) ran at {', '.join(commits)} "
                  f"({len(on_pieces)} cells)."]
    lines += [""]
    sections = (("every baseline", BASELINES, "slimpack"),
                (f"the baselines that train whole documents ({', '.join(WHOLE_DOCUMENT)})", WHOLE_DOCUMENT, "slimpack"),
                (f"the baselines that cut documents ({', '.join(CUTTING)}), with SlimPack planning the same pieces "
                 "(their fixed-length cut of the batch: the same attention work)", CUTTING, "slimpack_on_pieces"))
    for title, names, key in sections:
        s = summarize(cells, names, key)
        lines += [
            f"Against {title}:", "",
            f"- cells: **{s['cells']}**; cells where none of them fits or runs: {s['no_baseline_fits']}",
            f"- SlimPack OOM or failed where one of them fits: "
            f"**{len(s['slimpack_oom_or_failed_where_a_baseline_fits'])}** "
            f"{s['slimpack_oom_or_failed_where_a_baseline_fits'] or ''}",
            f"- SlimPack >= the best one's tokens/s: **{s['at_least_best_baseline']} of {s['compared']}** "
            f"({s['at_least_best_baseline'] / max(1, s['compared']):.1%}); below 0.97x: {len(s['below_0.97'])} "
            f"{s['below_0.97'] or ''}",
            f"- SlimPack / best tokens/s: min {_fmt(s['ratio_min'])}, median {_fmt(s['ratio_median'])}", ""]
    worst = like_for_like(cells)
    if worst:
        lines += [_at_least("On the same work (each baseline against SlimPack on what that baseline trains: the "
                            "whole-document ones on the documents, the cutting ones on the pieces)", worst,
                            "every baseline"), ""]
    works = {cell["index"]: trained_work_s(cell) for cell in cells}
    lost = behind_best_baseline(cells, works)
    less = [row for row in lost if row.trained_work_ratio < 1 - 1e-12]
    same = sorted(row.index for row in lost if row not in less)
    if not lost:
        lines += ["SlimPack is nowhere below the best baseline's tokens/s.", ""]
    else:
        shortfalls = [1 - row.trained_work_ratio for row in less]
        rates = [row.work_rate_ratio for row in lost]
        lines += [
            f"Where SlimPack is below the best baseline ({len(lost)} cells), that baseline trained less work "
            f"than SlimPack on the same tokens in {len(less)} {sorted(row.index for row in less) or ''} (it cut "
            f"documents at sequence boundaries: the pieces' whole-document work is "
            f"{_range(min(shortfalls), max(shortfalls)) if less else '-'} below the documents'), and the same "
            f"work in {len(same)}{f' {same}' if same else ''}. Per second of step, SlimPack trains "
            f"{_range(min(rates), max(rates), percent=False)}x the whole-document work that baseline trains "
            f"(`trained_work_s`; the tokens/s ratio over the trained-work ratio).", ""]
    rates = work_rate_ratios(cells, works)
    if rates:
        lines += [_at_least("On the work each strategy trains (whole-document seconds per second of step, "
                            "`trained_work_s`: a cutting baseline credited with the work of its pieces, not of the "
                            "documents it cut)", rates, "the best baseline"), ""]
    s = summarize(cells)
    fits = summarize([c for c in cells if _best_fitting(c, BASELINES)])
    lines += [
        f"SlimPack's step / the layout's lower bound (see the docstring): median "
        f"{_fmt(s['step_over_lower_bound_median'])}, worst 5% from {_fmt(s['step_over_lower_bound_p5_worst'])} over "
        f"every cell; median {_fmt(fits['step_over_lower_bound_median'])}, worst 5% from "
        f"{_fmt(fits['step_over_lower_bound_p5_worst'])} over the cells where some baseline fits. The bound "
        f"ignores memory: where nothing else fits, SlimPack often fits only by holding fewer groups in flight, "
        f"which serialises the pipeline (the largest ratios are all such cells).", "",
        "| # | dataset | model | ctx | tok/GPU | tp pp vpp cp dp | recompute | slimpack tok/s | won by | best baseline | "
        "ratio | its compute / SlimPack's | its trained work / SlimPack's | best whole-doc | ratio | "
        "SlimPack on the pieces / best cutting | step / bound |",
        "|---:|---|---|---:|---:|---|---|---:|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for cell in sorted(cells, key=lambda c: c["index"]):
        slim = cell["strategies"]["slimpack"]
        slim_text = "OOM" if slim["oom"] else ("failed" if slim["failed"] else f"{slim['tokens_per_s']:,.0f}")
        columns = []
        for names in (BASELINES, WHOLE_DOCUMENT):
            best = _best_fitting(cell, names)
            columns.append(f"{best[0]} {best[1]:,.0f}" if best else "none fits")
            columns.append(_fmt(slim["tokens_per_s"] / best[1] if best and _slimpack_ok(cell) else None))
            if names is BASELINES:
                columns.append(_fmt(_work_ratio(cell, best[0]) if best and _slimpack_ok(cell) else None))
                columns.append(_fmt(trained_work_ratio(best[0], works[cell["index"]]) if best else None))
        on_pieces = _pieces_over_cutting(cell)
        columns.append(_fmt(on_pieces or None))  # failed on the pieces: no ratio
        bound = slim["step_s"] / slim["lower_bound_s"] if slim.get("lower_bound_s") else None
        lines.append(
            f"| {cell['index']} | {cell['dataset']} | {cell['model']}{_gpu(cell)} | {cell['context'] // 1024}K | "
            f"{cell['tokens_per_gpu'] // 1024}K | {cell['tp']} {cell['pp']} {cell['vpp']} {cell['cp']} {cell['dp']} | "
            f"{cell['recompute']} | {slim_text} | {slim.get('candidate') or '-'} | {' | '.join(columns)} | "
            f"{_fmt(bound)} |")
    return "\n".join(lines) + "\n"


def _gpu(cell: dict) -> str:
    """`` on <gpu>`` for a cell of the ``--wide`` space off the H100 preset."""
    return f" on {cell['gpu']}" if cell.get("gpu", "h100-sxm") != "h100-sxm" else ""


def _at_least(basis: str, ratios: list[tuple[float, int]], whom: str) -> str:
    """The report's sentence on ``ratios`` (SlimPack over ``whom`` on ``basis``, and the cell, per
    cell where SlimPack and some baseline fit)."""
    behind = sorted(i for r, i in ratios if r < 1 - 1e-9)
    return (f"{basis}, over the {len(ratios)} cells where SlimPack and some baseline fit: SlimPack is at least "
            f"{whom} in **{len(ratios) - len(behind)} of {len(ratios)}**; behind in {len(behind)} {behind or ''}; "
            f"below 0.97x: {sum(r < 0.97 for r, _ in ratios)}; worst ratio {_fmt(min(r for r, _ in ratios))}.")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _range(low: float, high: float, *, percent: bool = True) -> str:
    """``low``-``high`` as percentages (or plain ratios), one figure where they round alike."""
    text = [f"{v:.2%}" if percent else f"{v:.3f}" for v in (low, high)]
    return text[0] if text[0] == text[1] else f"{text[0]}-{text[1]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--part", default="0/1", help="i/n: run the cells whose index is i modulo n")
    parser.add_argument("--out", default="docs/stress", help="folder of per-cell JSON results (resumable; kept in the repo)")
    parser.add_argument("--report", action="store_true", help="write docs/stress.md from the results so far")
    parser.add_argument("--doc", default="docs/stress.md")
    parser.add_argument("--pieces", action="store_true",
                        help="run SlimPack on the fixed-length pieces (this checkout) in every finished cell of this "
                             "part where another commit ran it or none did")
    parser.add_argument("--wide", action="store_true",
                        help="draw new cells from the wider space of the docstring (a probe outside the sweep's band)")
    parser.add_argument("--models", help="with --wide: comma list of the model presets to draw from (default: "
                                         f"{','.join(WIDE_MODELS)})")
    parser.add_argument("--cut-documents", action="store_true",
                        help="draw the cells with TrainConfig.cut_documents: every strategy trains the pieces of the "
                             "fixed-length cut (one work basis; keep the results apart with --out/--doc)")
    parser.add_argument("--rerun", metavar="STRATEGY", choices=list(STRATEGIES),
                        help="run this strategy again (this checkout) in every finished cell of this part where another "
                             "commit ran it, keeping the other strategies' records")
    args = parser.parse_args()
    try:
        part, parts = (int(x) for x in args.part.split("/"))
        if not 0 <= part < parts:
            raise ValueError
    except ValueError:
        print(f"stress: --part must be i/n with 0 <= i < n, got {args.part!r}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        cells = [json.loads(p.read_text()) for p in sorted(out.glob("cell-*.json"))]
        cells = [c for c in cells if c["index"] < args.cells]
        # the command that made these cells: another --out (and --doc) keeps a probe apart from the sweep's
        where = "".join(f" --{name} {getattr(args, name)}" for name in ("out", "doc")
                        if getattr(args, name) != parser.get_default(name))
        where += " --wide" if any("gpu" in c for c in cells) else ""
        where += f" --models {args.models}" if args.models else ""
        where += " --cut-documents" if any(c.get("cut_documents") for c in cells) else ""
        Path(args.doc).write_text(report(cells, f"python benchmarks/stress.py --cells {args.cells} --seed {args.seed}{where}"))
        print(json.dumps({"every baseline": summarize(cells), "whole-document": summarize(cells, WHOLE_DOCUMENT),
                          "cutting, on the pieces": summarize(cells, CUTTING, "slimpack_on_pieces")}, indent=1))
        return 0
    mine = [i for i in range(args.cells) if i % parts == part]
    if args.pieces:
        _update_finished(out, mine, lambda cell: cell.get("slimpack_on_pieces", {}).get("commit"), _pieces_again)
        return 0
    if args.rerun:
        _update_finished(out, mine, lambda cell: cell.get("rerun", {}).get(args.rerun),
                         lambda cell, commit: _strategy_again(cell, args.rerun, commit))
        return 0
    for n, index in enumerate(mine, 1):
        path = out / f"cell-{index:04d}.json"
        if path.exists():
            continue
        models = tuple(args.models.split(",")) if args.models else WIDE_MODELS
        cell = draw_wide_cell(args.seed, index, models) if args.wide else draw_cell(args.seed, index)
        if args.cut_documents:
            cell["cut_documents"] = True
        result = run_cell(cell) | {"commit": head_commit()}
        path.write_text(json.dumps(result))
        slim = result["strategies"]["slimpack"]
        print(f"[{n}/{len(mine)}] cell {index}: {cell['model']} {cell['context'] // 1024}K "
              f"tp{cell['tp']} pp{cell['pp']} vpp{cell['vpp']} cp{cell['cp']} dp{cell['dp']} {cell['recompute']} "
              f"slimpack {slim['tokens_per_s']:,.0f} tok/s oom={slim['oom']} ({result['seconds']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
