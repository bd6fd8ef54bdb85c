"""What ``tune`` shows: per strategy its best layout, the best-vs-best table, the search's counts,
a chart of tokens/s over the layouts tried, and the winning configs as ``--config`` files.
Must not import torch (matplotlib is imported only to draw the chart)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from slimpack.compare.run import BASELINE
from slimpack.config import save_config
from slimpack.tune.search import NOT_SCREENED, TuneResult


def best_rows(result: TuneResult) -> list[dict[str, Any]]:
    """One row per strategy: its best layout and figures, and its speed-up over the best layout of
    the fixed-length baseline (best vs best)."""
    rows = []
    for tuning in result.strategies:
        best, counts = tuning.best, tuning.counts()
        screened = next((t for t in tuning.trials if best and t.layout == best.layout), None)
        rows.append({
            "strategy": tuning.strategy,
            "layout": best.layout.label() if best else None,
            "protocol": protocol(result, best.phase) if best else None,
            "tokens_per_s": best.tokens_per_s if best else 0.0,
            "screen_tokens_per_s": screened.tokens_per_s if screened else None,
            "confirmed": [{"layout": t.layout.label(), "status": t.status, "tokens_per_s": t.tokens_per_s,
                           "screen_tokens_per_s": next(s.tokens_per_s for s in tuning.trials if s.layout == t.layout)}
                          for t in tuning.confirmed],
            "unconfirmed": [{"layout": t.layout.label(), "screen_tokens_per_s": t.tokens_per_s}
                            for t in tuning.unconfirmed],
            "efficiency": best.efficiency if best else None,
            "step_time_s": best.step_time_s if best else None,
            "peak_memory_bytes": best.peak_memory_bytes if best else None,
            "simulated": sum(n for status, n in counts.items() if status.startswith("simulated")),
            "failed": sum(n for status, n in counts.items() if status.startswith("failed")),
            "pruned": sum(n for status, n in counts.items() if status.startswith("pruned")),
            "not_screened": counts[NOT_SCREENED],
            "unscreened_ceiling_tokens_per_s": tuning.unscreened_ceiling,
            "reasons": dict(counts.most_common()),
            "search_s": sum(t.wall_s for t in (*tuning.trials, *tuning.confirmed)),
        })
    base = next((r["tokens_per_s"] for r in rows if r["strategy"] == BASELINE), 0.0)
    top = max((r["tokens_per_s"] for r in rows), default=0.0)
    for row in rows:
        row["vs_best_fixed"] = row["tokens_per_s"] / base if base else None
        row["vs_best_overall"] = row["tokens_per_s"] / top if top else None
    return rows

def protocol(result: TuneResult, phase: str) -> str:
    """Which steps a figure comes from: the screening step(s) or the confirmation window."""
    if phase == "window" and result.window is not None:
        return f"window: {result.window.describe()}"
    steps = result.screen.steps
    return f"screen: step{'s' if steps > 1 else ''} 0{f'–{steps - 1}' if steps > 1 else ''}, drain included"


def to_json(result: TuneResult) -> dict[str, Any]:
    config = result.best_config()
    return {"num_gpus": result.num_gpus, "dataset": result.dataset, "screen": result.screen.to_dict(),
            "window": result.window.to_dict() if result.window else None, "workers": result.workers,
            "ahead_discarded": result.ahead_discarded, "time_limit_s": result.time_limit_s,
            "model": result.base.model.name, "max_context": result.base.train.max_context,
            "global_batch_tokens": result.base.train.global_batch_tokens, "wall_s": result.wall_s,
            "skipped_layouts": dict(result.skipped), "strategies": best_rows(result),
            "best_config": config.to_dict() if config else None}

def search_summary(result: TuneResult) -> list[str]:
    """Lines that say what the search did: layouts skipped, simulated, pruned and failed, and why."""
    lines = [f"{n:5d} x skipped (every strategy): {reason}" for reason, n in result.skipped.most_common()]
    total: Counter[str] = Counter()
    for tuning in result.strategies:
        total.update(tuning.counts())
    for status, n in total.most_common():
        lines.append(f"{n:5d} x {status}")
    lines += [f"      {line}" for line in unscreened_lines(result)]
    if result.ahead_discarded:
        lines.append(f"{result.ahead_discarded:5d} x screened ahead by an idle worker, then pruned in order "
                     "(figures dropped)")
    if result.window is not None:
        confirmed = [t for tuning in result.strategies for t in tuning.confirmed]
        changed = sum(1 for tuning in result.strategies
                      if tuning.best and tuning.screen_best and tuning.best.layout != tuning.screen_best.layout)
        lines.append(f"{len(confirmed):5d} x front runner confirmed over the window ({result.window.describe()}; "
                     f"{sum(not t.ok for t in confirmed)} failed or out of memory there); the window changed "
                     f"the pick of {changed} strateg{'y' if changed == 1 else 'ies'}")
    return lines


OVERRUN_NOTED = 1.25
"""A limited search that ends past this multiple of its limit (and a second more) says why."""


def unscreened_lines(result: TuneResult) -> list[str]:
    """Per strategy the time limit cut short: how many layouts it left and the ceiling their floors
    allow, and the front runners it left unconfirmed; first, where the search ran well past its
    limit, why (the limit cannot cut a trial, and every strategy gets a screen and a window)."""
    lines = []
    limit = result.time_limit_s
    if limit is not None and result.wall_s > OVERRUN_NOTED * limit + 1:
        longest = max(t.wall_s for tuning in result.strategies for t in (*tuning.trials, *tuning.confirmed))
        lines.append(f"the search took {result.wall_s:.0f} s against the {limit:g} s limit: every strategy screens "
                     f"and confirms at least one layout, and a trial is never cut (the longest took {longest:.1f} s)")
    for tuning in result.strategies:
        ceiling, best = tuning.unscreened_ceiling, tuning.screen_best
        if ceiling is not None and best is not None:
            verdict = ("the limit changed nothing: their floors would have pruned them" if ceiling <= best.tokens_per_s
                       else f"{ceiling / best.tokens_per_s - 1:.1%} above its best screened, {best.tokens_per_s:,.0f}")
            lines.append(f"{tuning.strategy}: {tuning.counts()[NOT_SCREENED]} layouts not screened (time limit); "
                         f"their time floors cap them at {ceiling:,.0f} tokens/s on the screened steps, {verdict}")
        if tuning.unconfirmed:
            lines.append(f"{tuning.strategy}: {len(tuning.unconfirmed)} front runner(s) not confirmed (time limit): "
                         + ", ".join(f"{t.layout.label()} ({t.tokens_per_s:,.0f} screened)" for t in tuning.unconfirmed))
    return lines


def markdown_table(result: TuneResult) -> str:
    lines = ["| strategy | best layout | tokens/s | efficiency | vs fixed's best | figures from | "
             f"simulated / pruned / failed{' / not screened' if result.time_limit_s is not None else ''} |",
             "|---|---|---:|---:|---:|---|---|"]
    for r in best_rows(result):
        counts = f"{r['simulated']} / {r['pruned']} / {r['failed']}"
        if result.time_limit_s is not None:
            counts += f" / {r['not_screened']}"
        if r["layout"] is None:
            lines.append(f"| {r['strategy']} | none fits | — | — | — | — | {counts} |")
            continue
        ratio = f"{r['vs_best_fixed']:.2f}x" if r["vs_best_fixed"] else "—"
        lines.append(f"| {r['strategy']} | {r['layout']} | {r['tokens_per_s']:,.0f} | {r['efficiency']:.3f} | "
                     f"{ratio} | {r['protocol']} | {counts} |")
    return "\n".join(lines)

def write_configs(result: TuneResult, directory: Path) -> list[Path]:
    """``best-<strategy>.json`` per strategy that found a layout, and ``best.json`` overall."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for tuning in result.strategies:
        config = result.best_config(tuning.strategy)
        if config is not None:
            paths.append(directory / f"best-{tuning.strategy}.json")
            save_config(config, paths[-1])
    return paths

def throughput_chart(result: TuneResult, path: Path) -> None:
    """Screening tokens/s of every simulated layout, per strategy, in the order the search tried
    them (the search goes by rising time floor, so the cloud thins out to the right as layouts stop
    paying); a star marks the layout chosen (after confirmation over the window, if any)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    for tuning in result.strategies:
        ok = [t for t in tuning.trials if t.ok]
        if not ok:
            continue
        xs = range(1, len(ok) + 1)
        line, = ax.plot(xs, [t.tokens_per_s / 1e3 for t in ok], marker="o", markersize=4, linestyle="none",
                        label=tuning.strategy)
        best = tuning.best
        if best is not None:  # the chosen layout, at its screening figure
            index = next(i for i, t in enumerate(ok, 1) if t.layout == best.layout)
            ax.plot([index], [ok[index - 1].tokens_per_s / 1e3], marker="*", markersize=12, color=line.get_color())
    par = result.base
    ax.set_title(f"{result.dataset}: {par.model.name} on {result.num_gpus}x {par.cluster.name}, "
                 f"{par.train.max_context // 1024}K context (simulated screening figures; star = chosen layout)",
                 fontsize=10)
    ax.set_xlabel("simulated layouts, in search order (rising time floor)")
    ax.set_ylabel("thousand tokens / s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

def write_report(result: TuneResult, directory: Path, command: list[str]) -> Path:
    """``tune.md`` (table and how to reproduce), ``tune.json``, ``tune.png`` and the best configs."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    throughput_chart(result, directory / "tune.png")
    configs = write_configs(result, directory)
    limit_note = "".join(f"{line}\n\n" for line in unscreened_lines(result))
    (directory / "tune.json").write_text(json.dumps(to_json(result), indent=2) + "\n")
    text = (f"# slimpack tune: {result.dataset}, {result.base.model.name}, {result.num_gpus} GPUs\n\n"
            f"Simulated with the default cost model. Command: `{' '.join(command)}`\n\n"
            f"{markdown_table(result)}\n\n{limit_note}![tokens/s over the layouts tried](tune.png)\n\n"
            f"Best configs: {', '.join(f'`{p.name}`' for p in configs)}\n")
    path = directory / "tune.md"
    path.write_text(text)
    return path
