"""The comparison report: report.md and a self-contained report.html (images embedded)."""

from __future__ import annotations

import base64
import html
import platform
import shlex
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from slimpack.compare.charts import group_time_chart, memory_chart, throughput_chart
from slimpack.compare.row import COLUMNS, StrategyRow, cells, cut_document_notes, drain_notes
from slimpack.compare.run import Comparison
from slimpack.compare.step_charts import gantt_chart, step_throughput_chart
from slimpack.config import Config

CHARTS = (
    ("throughput.png", "Throughput", "Simulated tokens per second of each strategy over the same measured window."),
    ("step_throughput.png", "Throughput step by step",
     "Simulated tokens per second of every step: is a lead steady, or won on a few steps?"),
    ("gantt.png", "One step, device by device",
     "The same step (the same batch) for every strategy, on one time axis (first pipelines shown): forward, "
     "backward, gradient sync and idle time per device. The last panel zooms on a slice of SlimPack's step so "
     "that its groups can be told apart."),
    ("group_times.png", "Group time spread",
     "Forward and backward time of every group of the median step on a middle stage."),
    ("memory.png", "Peak memory", "Peak memory per pipeline stage against the GPU's usable memory."),
)


def _versions() -> str:
    names = ("slimpack", "numpy", "highspy", "matplotlib", "rich")
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return f"Python {platform.python_version()}; " + ", ".join(found)


def _markdown_table(rows: list[StrategyRow]) -> str:
    """The terminal table's columns and cells (``compare.row``), plus the failed-step count."""
    headers = [header for header, _ in COLUMNS] + ["failed steps"]
    lines = ["| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    for row in rows:
        lines.append("| " + " | ".join([*cells(row), str(len(row.failed_steps))]) + " |")
    return "\n".join(lines)


def write_report(comparison: Comparison, directory: Path, *, command: list[str]) -> Path:
    """Write the report into ``directory``; interrupted or failed, it leaves nothing behind (the files
    are written into a fresh folder beside it, renamed into place at the end)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        _write_files(comparison, staging, command=command)
        directory.mkdir(exist_ok=True)
        for file in staging.iterdir():
            file.replace(directory / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory / "report.html"


def _write_files(comparison: Comparison, directory: Path, *, command: list[str]) -> None:
    rows = comparison.table()
    throughput_chart(rows, directory / "throughput.png")
    step_throughput_chart(comparison.runs, directory / "step_throughput.png")
    gantt_chart(comparison.runs, directory / "gantt.png")
    group_time_chart(comparison.runs, directory / "group_times.png")
    memory_chart(comparison.runs, directory / "memory.png")
    config = comparison.config
    par = config.parallel
    winner = max(rows, key=lambda r: r.tokens_per_s)
    summary = (f"**{winner.strategy}** is fastest: {winner.tokens_per_s:,.0f} tokens/s"
               + (f", {winner.speedup_vs_fixed:.2f}x the fixed-length baseline" if winner.speedup_vs_fixed else "")
               + (f", efficiency {winner.efficiency:.3f}." if winner.efficiency is not None else "."))
    setup = (f"{comparison.dataset} dataset; {config.model.name} on {par.num_devices} x {config.cluster.name} "
             f"(tp {par.tp}, pp {par.pp}, dp {par.dp}, cp {par.cp}, vpp {par.virtual_stages}); "
             f"{config.train.max_context} max context; {config.train.global_batch_tokens:,} tokens per batch; "
             f"recompute {config.train.recompute}; {comparison.window.describe()}; "
             f"{comparison.context_cut.describe()}.")
    failures = [f"- {r.strategy}: failed on step(s) {list(r.failed_steps)}: {'; '.join(r.errors)}"
                for r in rows if r.failed_steps]
    sections = [f"# slimpack comparison (simulated)\n\n{_basis(config)}\n\n{summary}\n\n{setup}\n",
                _markdown_table(rows), _idle_table(rows)]
    drains = drain_notes(rows)
    if drains:
        sections.append("Drain after the window:\n\n" + "\n".join(f"- {note}." for note in drains))
    sections += [f"Work basis: {note}." for note in cut_document_notes(rows)]
    if failures:
        sections.append("Failures:\n\n" + "\n".join(failures))
    sections.append("Figures are over the measured window only: warm-up and drain steps are excluded. "
                    "Efficiency = ideal step time / simulated step time, where the ideal is the whole documents' "
                    "training work (unsliced, no overheads, at full kernel efficiency) spread evenly over all GPUs: "
                    "the same for every strategy on the same documents. Extra work = the plan's own modelled work "
                    "over that ideal (slicing, per-call costs, tensor/context-parallel communication, "
                    "recomputation). MFU = the whole documents' model FLOPs per second over the GPUs' peak. "
                    "Documents longer than the context are cut into context-length chunks by the data sampler "
                    "(no token is dropped). Delay = steps a token waited because its strategy deferred it.")
    for file, title, text in CHARTS:
        if (directory / file).exists():
            sections.append(f"## {title}\n\n{text}\n\n![{title}]({file})")
    sections.append(f"## Reproduce\n\n```\n{shlex.join(command)}\n```\n\n{_versions()}")
    markdown = "\n\n".join(sections) + "\n"
    (directory / "report.md").write_text(markdown)
    (directory / "report.html").write_text(_html(markdown, directory))


def _basis(config: Config) -> str:
    """What the figures are: simulated, with which cost model and which assumptions."""
    eff = config.efficiency
    basis = ("calibrated on this machine's measurements" if eff.kernels == "calibrated"
             else "not calibrated: preset figures, not measurements of a cluster")
    return (f"**Simulated**, not measured: slimpack's DAG simulator with its cost model ({basis}). "
            f"Assumptions: {config.cluster.name}, {config.cluster.peak_flops / 1e12:.0f} TFLOP/s peak; "
            f"{eff.assumptions()}; tensor parallelism with sequence parallelism, 4 collectives per layer "
            f"forward and 6 backward, none overlapped with compute; activation memory per Korthikanti et al. "
            f"with FlashAttention; recomputation {config.train.recompute}.")


def _idle_table(rows: list[StrategyRow]) -> str:
    """Where each strategy's idle device time goes (``sim.idle``), over its steps."""
    lines = ["Idle device time, by cause (share of all device time): fill/drain = the bubble a balanced "
             "pipeline with as many groups would have; replica wait = waiting for the slowest data-parallel "
             "replica; throttled = a forward was ready but the schedule held it (activation memory); "
             "imbalance = the rest (unequal work between stages).", "",
             "| strategy | fill/drain | replica wait | throttled | imbalance |", "|---|---:|---:|---:|---:|"]
    for row in rows:
        idle = row.idle
        if idle is not None:
            lines.append(f"| {row.strategy} | {100 * idle['fill_drain']:.1f}% | {100 * idle['replica_wait']:.1f}% | "
                         f"{100 * idle['throttled']:.1f}% | {100 * idle['imbalance']:.1f}% |")
    return "\n".join(lines)


def _html(markdown: str, directory: Path) -> str:
    """A minimal Markdown-to-HTML rendering of the report (headings, tables, images, code)."""
    out, in_table, in_code = [], False, False
    for line in markdown.splitlines():
        if line.startswith("```"):
            out.append("</pre>" if in_code else "<pre>")
            in_code = not in_code
            continue
        if in_code:
            out.append(html.escape(line))
            continue
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-:"):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("!["):
            file = line[line.index("(") + 1:-1]
            data = base64.b64encode((directory / file).read_bytes()).decode()
            out.append(f'<p><img alt="{html.escape(file)}" src="data:image/png;base64,{data}"></p>')
        elif line.startswith("## "):
            out.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            out.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    if in_table:
        out.append("</table>")
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}img{max-width:100%}pre{background:#f4f4f4;padding:8px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>slimpack comparison</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(out) + "\n</body></html>\n")


def _inline(text: str) -> str:
    escaped = html.escape(text)
    parts = escaped.split("**")
    return "".join(f"<b>{p}</b>" if k % 2 else p for k, p in enumerate(parts))
