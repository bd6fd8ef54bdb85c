"""Every baseline at its best micro-batch token cap: how much of SlimPack's lead is the baselines'
default of one context-length sequence per micro-batch.

The packers all have a token cap per micro-batch (Megatron's micro-batch size times its sequence
length, TRL's per-device batch times its packed length, verl's ``max_token_len_per_gpu``), which
their users raise where memory allows: fewer, fuller micro-batches pay less per-group overhead and
run their GEMMs more efficiently, at the price of larger pipeline bubbles. The comparisons elsewhere
(``docs/stress.md``, the matrix, ``tune``) give every baseline a cap of ``max_context``. Here each of
fixed, bfd, kk, wlb and ByteScale also runs at 2, 4, 8, ... 64 times that cap (``micro_batch_tokens``),
upwards until a cap runs out of memory or fails (a larger one holds more), is slower than the one
before (throughput over the cap rose, then fell, wherever we looked; a benchmark's shortcut, not a
proof), or exceeds a replica's share of the batch (it can change nothing more); its best cap counts.

Cells: every ``--every``-th cell of the stress sweep (``benchmarks/stress.py``, seed 12, contexts
8K-256K; SlimPack's and the baselines' records at the context's cap are read from ``docs/stress/``),
and ``--short`` cells drawn the same way (seed 13) at contexts of 1K-4K, where everything is run here.
One step per cell, simulated with the default (uncalibrated) H100 cost model.

    python benchmarks/baseline_caps.py --every 5 --short 24 --part 0/2   # resumable; cells in docs/baseline-caps/
    python benchmarks/baseline_caps.py --every 5 --short 24 --report     # -> docs/baseline-caps.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from stress import draw_cell, head_commit, run_strategy_in_cell

from slimpack.data import load_dataset
from slimpack.strategies import CUTS_DOCUMENTS

CAPPED = ("fixed", "bfd", "kk", "wlb", "bytescale")
"""The baselines with a token cap (SlimPipe slices context-length sequences and has none)."""
WHOLE_DOCUMENT = tuple(name for name in CAPPED if name not in CUTS_DOCUMENTS)
MULTIPLES = (2, 4, 8, 16, 32, 64)
SHORT_CONTEXTS = (1024, 2048, 4096)
STRESS_SEED, SHORT_SEED = 12, 13
ROOT = Path(__file__).resolve().parents[1]


def _fits(record: dict) -> bool:
    return not record["oom"] and not record["failed"]


def capped_records(cell: dict, names: tuple[str, ...] = CAPPED) -> dict[str, dict[int, dict]]:
    """Per capped baseline of ``names``, its record at each multiple of the context tried beyond 1."""
    from stress import cell_config

    config = cell_config(cell)
    dataset = load_dataset(cell["dataset"])
    per_replica = config.train.global_batch_tokens // config.parallel.dp
    out: dict[str, dict[int, dict]] = {}
    for name in names:
        out[name] = {}
        before = cell["strategies"][name]
        for multiple in MULTIPLES:
            cap = multiple * cell["context"]
            if cap // 2 >= per_replica:  # the previous cap already held a replica's whole share
                break
            capped = dataclasses.replace(config, train=dataclasses.replace(config.train, micro_batch_tokens=cap))
            record = run_strategy_in_cell(name, capped, dataset)
            out[name][multiple] = record
            if not _fits(record) or (_fits(before) and record["tokens_per_s"] < before["tokens_per_s"]):
                break
            before = record
    return out


def run_cell(kind: str, index: int) -> dict:
    began = time.perf_counter()
    if kind == "stress":
        cell = json.loads((ROOT / "docs" / "stress" / f"cell-{index:04d}.json").read_text())
    else:
        from stress import cell_config

        cell = draw_cell(SHORT_SEED, index, SHORT_CONTEXTS)
        config, dataset = cell_config(cell), load_dataset(cell["dataset"])
        cell["strategies"] = {name: run_strategy_in_cell(name, config, dataset) for name in ("slimpack", *CAPPED)}
    cell = {"kind": kind, **{k: cell[k] for k in ("index", "dataset", "model", "context", "tokens_per_gpu", "tp",
                                                   "pp", "vpp", "cp", "dp", "recompute", "strategies")}}
    cell["strategies"] = {name: cell["strategies"][name] for name in ("slimpack", *CAPPED)}
    cell["capped"] = capped_records(cell)
    cell["seconds"], cell["commit"] = time.perf_counter() - began, head_commit()
    return cell


def rerun(cell: dict, name: str) -> dict:
    """``cell`` with ``name``'s records of the current code: at the context's cap, a stress cell's
    read from docs/stress (its own sweep re-runs a strategy: ``stress.py --rerun``), a short cell's
    planned again here; a capped baseline's larger caps are run again here. The commit is noted."""
    from stress import cell_config

    if cell["kind"] == "stress":
        record = json.loads((ROOT / "docs" / "stress" / f"cell-{cell['index']:04d}.json").read_text())
        at_context, commit = record["strategies"][name], record.get("rerun", {}).get(name, record["commit"])
    else:
        at_context = run_strategy_in_cell(name, cell_config(cell), load_dataset(cell["dataset"]))
        commit = head_commit()
    cell = {**cell, "strategies": {**cell["strategies"], name: at_context},
            "rerun": {**cell.get("rerun", {}), name: commit}}
    if name in CAPPED:
        cell["capped"] = {**cell["capped"], **capped_records(cell, (name,))}
    return cell


def best_cap(cell: dict, name: str) -> tuple[int, float] | None:
    """``name``'s best (multiple, tokens/s) over the caps that fit (None if none fits)."""
    tried = {1: cell["strategies"][name], **{int(m): r for m, r in cell["capped"][name].items()}}
    fitting = {m: r["tokens_per_s"] for m, r in tried.items() if _fits(r)}
    if not fitting:
        return None
    multiple = max(fitting, key=lambda m: (fitting[m], -m))
    return multiple, fitting[multiple]


def summarize(cells: list[dict], names: tuple[str, ...]) -> dict:
    """SlimPack over the best of ``names``, at the context's cap and at each one's best cap."""
    at_context, at_best, raised = [], [], []
    for cell in cells:
        slim = cell["strategies"]["slimpack"]
        if not _fits(slim):
            continue
        plain = [cell["strategies"][n]["tokens_per_s"] for n in names if _fits(cell["strategies"][n])]
        best = [b for b in (best_cap(cell, n) for n in names) if b is not None]
        if not best:
            continue
        top = max(t for _, t in best)
        at_best.append((slim["tokens_per_s"] / top, cell["kind"], cell["index"]))
        if plain:
            at_context.append(slim["tokens_per_s"] / max(plain))
            if top > max(plain):
                raised.append(top / max(plain))
    values = sorted(r for r, _, _ in at_best)
    return {"compared": len(values), "context_cap_at_least": sum(r >= 1 - 1e-9 for r in at_context),
            "context_cap_compared": len(at_context),
            "at_least": sum(r >= 1 - 1e-9 for r in values),
            "below_0.97": sorted(f"{k} {i}" for r, k, i in at_best if r < 0.97),
            "min": values[0] if values else None, "median": statistics.median(values) if values else None,
            "raised": len(raised), "raised_median": statistics.median(raised) if raised else None,
            "raised_max": max(raised) if raised else None}


def report(cells: list[dict], command: str) -> str:
    lines = ["# Baselines at their best micro-batch token cap", "",
             "Simulated with the default (uncalibrated) H100 cost model, one step per cell. See "
             "`benchmarks/baseline_caps.py` for the method; `--micro-batch-tokens` sets the cap in "
             "`plan`, `compare` and `tune`.", "",
             f"Reproduce: `{command}` (then `--report`). Commit(s): "
             f"{', '.join(sorted({c['commit'] for c in cells}))}."]
    for name in sorted({n for c in cells for n in c.get("rerun", {})}):
        again = sorted({c["rerun"][name] for c in cells if name in c.get("rerun", {})})
        lines += [f"{name}'s records refreshed (`--rerun {name}`) at {', '.join(again)}."]
    lines += [""]
    for kind, title in (("stress", "Stress cells (contexts 8K-256K)"), ("short", "Short contexts (1K-4K)")):
        group = [c for c in cells if c["kind"] == kind]
        if not group:
            continue
        lines += [f"## {title}: {len(group)} cells", ""]
        for label, names in (("the baselines that train whole documents (bfd, kk, wlb, bytescale)", WHOLE_DOCUMENT),
                             ("every capped baseline (with fixed)", CAPPED)):
            s = summarize(group, names)
            if not s["compared"]:
                continue
            lines += [f"Against {label}:", "",
                      f"- SlimPack >= the best at the context's cap: {s['context_cap_at_least']} of "
                      f"{s['context_cap_compared']} cells",
                      f"- SlimPack >= the best at its best cap: **{s['at_least']} of {s['compared']}**; "
                      f"below 0.97x: {len(s['below_0.97'])} {s['below_0.97'] or ''}",
                      f"- SlimPack / the best at its best cap: min {s['min']:.3f}, median {s['median']:.3f}",
                      f"- a larger cap raised the best baseline in {s['raised']} cells"
                      + (f" (median {s['raised_median']:.3f}x, up to {s['raised_max']:.3f}x)" if s["raised"] else ""),
                      ""]
        lines += ["| # | dataset | model | ctx | tok/GPU | tp pp vpp cp dp | recompute | slimpack tok/s | "
                  + " | ".join(f"{n} (best cap)" for n in CAPPED) + " |",
                  "|---:|---|---|---:|---:|---|---|---:|" + "---:|" * len(CAPPED)]
        for c in group:
            slim = c["strategies"]["slimpack"]
            slim_text = f"{slim['tokens_per_s']:,.0f}" if _fits(slim) else "OOM"
            cols = []
            for n in CAPPED:
                b = best_cap(c, n)
                cols.append("OOM" if b is None else f"{b[1]:,.0f} (x{b[0]})")
            lines.append(f"| {c['index']} | {c['dataset']} | {c['model']} | {c['context'] // 1024}K | "
                         f"{c['tokens_per_gpu'] // 1024}K | {c['tp']} {c['pp']} {c['vpp']} {c['cp']} {c['dp']} | "
                         f"{c['recompute']} | {slim_text} | "
                         + " | ".join(cols) + " |")
        lines += [""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=5, help="every n-th stress cell (of 200)")
    parser.add_argument("--short", type=int, default=24, help="short-context cells")
    parser.add_argument("--part", default="0/1", help="i/n: run the cells whose position is i modulo n")
    parser.add_argument("--out", default=str(ROOT / "docs" / "baseline-caps"))
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--rerun", metavar="STRATEGY", choices=("slimpack", *CAPPED),
                        help="refresh this strategy's records in the cells already run: at the context's "
                             "cap a stress cell's from docs/stress (run its --rerun first), a short cell's "
                             "planned again; a baseline's larger caps run again")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = [("stress", i) for i in range(0, 200, args.every)] + [("short", i) for i in range(args.short)]
    if args.report:
        cells = [json.loads((out / f"{k}-{i:04d}.json").read_text()) for k, i in todo
                 if (out / f"{k}-{i:04d}.json").exists()]
        command = f"python benchmarks/baseline_caps.py --every {args.every} --short {args.short}"
        (ROOT / "docs" / "baseline-caps.md").write_text(report(cells, command) + "\n")
        print(f"{len(cells)} of {len(todo)} cells -> docs/baseline-caps.md")
        return
    part, parts = map(int, args.part.split("/"))
    if args.rerun:
        for position, (kind, index) in enumerate(todo):
            path = out / f"{kind}-{index:04d}.json"
            if position % parts == part and path.exists():
                cell = rerun(json.loads(path.read_text()), args.rerun)
                path.write_text(json.dumps(cell))
                best = best_cap(cell, args.rerun) if args.rerun in CAPPED else None
                print(f"{kind} {index}: {args.rerun} {cell['strategies'][args.rerun]['tokens_per_s']:,.0f} tokens/s"
                      + (f", best x{best[0]} {best[1]:,.0f}" if best else ""), flush=True)
        return
    for position, (kind, index) in enumerate(todo):
        path = out / f"{kind}-{index:04d}.json"
        if position % parts != part or path.exists():
            continue
        cell = run_cell(kind, index)
        path.write_text(json.dumps(cell))
        best = {n: best_cap(cell, n) for n in CAPPED}
        print(f"{kind} {index}: {cell['seconds']:.0f} s; best caps "
              + ", ".join(f"{n} x{b[0]}" for n, b in best.items() if b), flush=True)


if __name__ == "__main__":
    main()
