import dataclasses
import json
import statistics

import pytest

from slimpack import api
from slimpack.compare import Window, compare
from slimpack.compare.row import StrategyRow, cut_document_notes, percentile
from slimpack.compare.run import run_strategy
from slimpack.config import ParallelConfig, PlannerConfig, TrainConfig, build_config
from slimpack.cost.stages import stage_work
from slimpack.data import load_dataset
from slimpack.strategies import STRATEGIES
from slimpack.strategies.fixed import FixedPlanner
from slimpack.strategies.stream import stream_batches

SMALL = ["--dataset", "pydocs", "--max-context", "32K", "--global-batch-tokens", "256K", "--tp", "8",
         "--pp", "2", "--dp", "2"]


def _config():
    return build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=2, dp=2),
                        train=TrainConfig(max_context=32768, global_batch_tokens=1 << 18))


class FailsOnStepOne(FixedPlanner):
    name = "flaky"

    def plan(self, batch, *, step):
        if step == 1:
            raise RuntimeError("boom")
        return super().plan(batch, step=step)


def _rows(comparison):
    return {r.strategy: r for r in comparison.table()}


def test_the_window_excludes_warm_up_and_drain_and_carries_deferred_work():
    window = Window(warmup_steps=2, steps=3)
    comparison = compare(_config(), load_dataset("pydocs"), ["fixed", "slimpack", "wlb"], window)
    rows = _rows(comparison)
    assert rows["fixed"].speedup_vs_fixed == 1.0
    runs = {run.name: run for run in comparison.runs}
    # stateless strategies skip the warm-up; the stateful one runs it, unmeasured
    assert [(s.step, s.phase) for s in runs["fixed"].steps] == [(2, "window"), (3, "window"), (4, "window")]
    assert [s.phase for s in runs["wlb"].steps[:5]] == ["warmup"] * 2 + ["window"] * 3
    for name, run in runs.items():
        window_steps = run.in_phase("window")
        assert [s.step for s in window_steps] == [2, 3, 4]
        times = [s.result.step_time_s for s in window_steps]
        row = rows[name]
        assert row.steps == 3 and not row.failed_steps
        assert row.tokens_per_s == pytest.approx(sum(s.scheduled_tokens for s in window_steps) / sum(times))
        assert row.step_time_mean_s == pytest.approx(statistics.fmean(times))
        assert row.step_time_p95_s == max(times)  # nearest rank of 3 values at 95%: the largest
        assert row.held_after_window_tokens == window_steps[-1].held_tokens
        drain = run.in_phase("drain")
        assert row.drain_steps == len(drain)
        assert row.drain_tokens == sum(s.scheduled_tokens for s in drain)
    # the stateless strategies train exactly the window's batches; wlb trains what it carried in
    # from the warm-up and holds some back past the window, then drains it apart
    window_tokens = sum(s.scheduled_tokens for s in runs["fixed"].in_phase("window"))
    wlb = runs["wlb"]
    carried_in = wlb.in_phase("warmup")[-1].held_tokens
    assert sum(s.scheduled_tokens for s in wlb.in_phase("window")) == (
        window_tokens + carried_in - rows["wlb"].held_after_window_tokens)
    assert rows["wlb"].held_after_window_tokens > 0 and rows["wlb"].drain_tokens == rows["wlb"].held_after_window_tokens
    assert sum(s.scheduled_tokens for s in runs["slimpack"].in_phase("window")) == window_tokens


def test_percentile_is_the_nearest_rank():
    values = [5.0, 1.0, 4.0, 2.0, 3.0] * 4  # 20 values: rank round(0.95 * 19) = 18 of the sorted list
    assert percentile(values, 95) == 5.0
    assert percentile(list(range(101)), 95) == 95
    assert percentile(list(range(101)), 50) == 50


def test_a_strategy_failing_on_one_step_is_reported_and_the_others_go_on(monkeypatch):
    monkeypatch.setitem(STRATEGIES, "flaky", FailsOnStepOne)
    rows = _rows(compare(_config(), load_dataset("pydocs"), ["fixed", "flaky"], Window(warmup_steps=0, steps=3)))
    assert rows["flaky"].failed_steps == (1,) and "boom" in rows["flaky"].errors[0]
    assert rows["fixed"].failed_steps == ()
    assert rows["flaky"].tokens_per_s > 0


def test_cli_json_and_report(cli, tmp_path, capsys):
    out = tmp_path / "c.json"
    report = tmp_path / "report"
    assert cli(["compare", *SMALL, "--warmup", "1", "--steps", "2", "--strategies", "fixed,slimpack,wlb",
                "--json", str(out), "--report", str(report)]) == 0
    data = json.loads(out.read_text())
    assert data["window"] == {"warmup_steps": 1, "steps": 2, "first_step": 1, "last_step": 2}
    terminal = capsys.readouterr().out
    assert "steps 1–2 measured after 1 warm-up step" in terminal
    keys = {"strategy", "tokens_per_s", "step_time_mean_s", "step_time_p95_s", "speedup_vs_fixed", "efficiency",
            "bubble_fraction", "peak_memory_bytes", "memory_capacity_bytes", "oom_steps", "planner_time_p50_s",
            "mean_delay_steps_per_token", "failed_steps", "held_after_window_tokens", "drain_steps", "drain_time_s",
            "drain_tokens"}
    assert all(keys <= set(row) for row in data["strategies"])
    for name in ("report.md", "report.html", "throughput.png", "step_throughput.png", "gantt.png",
                 "group_times.png", "memory.png"):
        assert (report / name).stat().st_size > 1000
    html = (report / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5
    markdown = (report / "report.md").read_text()
    assert "slimpack compare" in markdown and "steps 1–2 measured after 1 warm-up step" in markdown
    # the terminal table and the report render the same cells (compare.row.COLUMNS)
    slimpack = next(row for row in data["strategies"] if row["strategy"] == "slimpack")
    tokens, efficiency = f"{slimpack['tokens_per_s']:,.0f}", f"{slimpack['efficiency']:.3f}"
    assert f"| slimpack | {tokens} |" in markdown and f" {efficiency} |" in markdown
    assert tokens in terminal and efficiency in terminal
    assert "wlb held" in terminal and "Drain after the window" in markdown
    # fixed cuts documents: both say so, with its work against SlimPack's on the same tokens
    assert "fixed cuts documents at sequence boundaries" in " ".join(terminal.split())
    assert "Work basis: fixed cuts documents" in markdown and "against slimpack's: fixed " in markdown
    # pydocs at a 32K context: 4 documents of 34K-52K tokens, each cut in two; said in the table, JSON, report
    cut = "4 of 497 documents longer than the 32768-token context cut into 32768-token chunks (+4 samples"
    assert data["context_cut"] == {"max_context": 32768, "num_docs": 497, "num_cut_docs": 4,
                                   "num_extra_samples": 4, "num_dropped_tokens": 0}
    assert cut in " ".join(terminal.split()) and cut in markdown
    # the title block says what the figures are and on which assumptions; the idle split is there
    assert "# slimpack comparison (simulated)" in markdown and "**Simulated**, not measured" in markdown
    assert "fa3 kernels: GEMM 0.75 of peak" in markdown and "| strategy | fill/drain |" in markdown


def _row(strategy, extra_work, window_tokens=1000, pieces_cut_off=None):
    """A row with only what the work-basis note reads set to something that matters (by default, a
    strategy that cuts documents cut off 3 pieces)."""
    if pieces_cut_off is None:
        pieces_cut_off = 3 if strategy in ("fixed", "slimpipe") else 0
    return StrategyRow(strategy=strategy, steps=8, failed_steps=(), errors=(), tokens_per_s=1.0,
                       window_tokens=window_tokens, window_time_s=1.0, speedup_vs_fixed=None, step_time_mean_s=1.0,
                       step_time_p95_s=1.0, ideal_time_mean_s=1.0, efficiency=None if extra_work is None else 0.5,
                       extra_work_fraction=extra_work, schedule_efficiency=None, idle=None, bubble_fraction=None,
                       mfu=None, peak_memory_bytes=0.0, memory_capacity_bytes=None, oom_steps=(),
                       planner_time_p50_s=None, mean_delay_steps_per_token=0.0, held_after_window_tokens=0,
                       pieces_cut_off=pieces_cut_off, drain_steps=0, drain_time_s=0.0, drain_tokens=0, held_after_drain_tokens=0)


def test_the_work_basis_note_names_the_strategies_that_cut_documents_with_their_work_against_slimpacks():
    # own work = (1 + extra work) x the same ideal: 1.125 / 1.25 = 0.9 and 1.375 / 1.25 = 1.1
    rows = [_row("slimpack", 0.25), _row("fixed", 0.125), _row("bfd", 0.1), _row("slimpipe", 0.375)]
    [note] = cut_document_notes(rows)
    assert note.startswith("fixed and slimpipe cut documents at sequence boundaries")
    assert note.endswith("against slimpack's: fixed -10.0%, slimpipe +10.0%")
    assert "bfd" not in note
    # no strategy that cuts documents ran: nothing to say; one that failed every step is left out
    assert cut_document_notes([_row("slimpack", 0.25), _row("bfd", 0.1)]) == []
    [note] = cut_document_notes([_row("slimpack", 0.25), _row("fixed", 0.125), _row("slimpipe", None)])
    assert note.startswith("fixed cuts documents") and "slimpipe" not in note
    # without SlimPack, or on other tokens (a strategy that failed a step), no work figures
    for rows in ([_row("fixed", 0.125)], [_row("slimpack", 0.25), _row("fixed", 0.125, window_tokens=900)]):
        [note] = cut_document_notes(rows)
        assert note.startswith("fixed cuts documents at sequence boundaries (3 pieces cut off over the window")
        assert "against slimpack's" not in note
    # where every document fits its sequence (a corpus chunked to the context) nothing was cut
    [note] = cut_document_notes([_row("slimpack", 0.25), _row("fixed", 0.125, pieces_cut_off=0), _row("slimpipe", 0.3)])
    assert note.startswith("slimpipe cuts documents") and "fixed" not in note
    assert cut_document_notes([_row("fixed", 0.125, pieces_cut_off=0), _row("slimpipe", 0.3, pieces_cut_off=0)]) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--strategies", "fixed,nope"], "unknown strategy 'nope'"),
    (["--model", "gpt9"], "unknown model 'gpt9'"),
    (["--dataset", "no-such-data"], "no-such-data"),
    (["--pp", "3"], "not divisible by pp"),
    (["--max-context", "8M"], "max_context"),
    (["--model", "llama2-70b", "--tp", "1", "--pp", "1"], "does not fit on h100-sxm"),
])
def test_bad_flags_give_one_line_and_exit_2(cli, capsys, argv, message):
    assert cli(["compare", *SMALL, "--warmup", "0", "--steps", "1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


def test_slimpack_beats_every_baseline_on_a_long_tailed_batch():
    # one 4M-token wlbllm batch at 128K on 64 simulated H100s (the demo's layout): a quality
    # regression check, deterministic (the MILP is off so no wall-clock limit can change the plan)
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=4, dp=2),
                          train=TrainConfig(max_context=131072, global_batch_tokens=4 << 20),
                          planner=PlannerConfig(use_milp=False))
    rows = _rows(compare(config, load_dataset("wlbllm"), list(STRATEGIES), Window(warmup_steps=0, steps=1)))
    ours = rows.pop("slimpack")
    assert ours.schedule_efficiency > 0.9  # its own work packs well...
    assert 0.0 < ours.extra_work_fraction < 1.0  # ...and is more than the whole-document ideal
    for name, row in rows.items():
        # slimpipe with cost-balanced slices comes within a few per cent on this one batch
        assert ours.tokens_per_s > (1.0 if name == "slimpipe" else 1.1) * row.tokens_per_s or name == "wlb", name
        assert ours.efficiency > row.efficiency or name == "wlb", name  # one ideal for all
    # a one-step window flatters wlb (it holds its outliers back past the window): on the same
    # tokens, i.e. with its drain, it is behind too
    wlb = rows["wlb"]
    assert wlb.held_after_window_tokens > 0 and wlb.drain_tokens == wlb.held_after_window_tokens
    assert wlb.tokens_per_s_with_drain == pytest.approx(
        (wlb.window_tokens + wlb.drain_tokens) / (wlb.step_time_mean_s * wlb.steps + wlb.drain_time_s))
    assert ours.tokens_per_s > 1.1 * wlb.tokens_per_s_with_drain


def test_a_strategy_that_cannot_run_the_layout_fails_alone():
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=2, dp=2, virtual_stages=2),
                          train=TrainConfig(max_context=32768, global_batch_tokens=1 << 18))
    rows = _rows(compare(config, load_dataset("pydocs"), ["fixed", "slimpipe"], Window(warmup_steps=1, steps=2)))
    assert rows["slimpipe"].failed_steps == (1, 2) and "2 virtual stages (use --vpp 1)" in rows["slimpipe"].errors[0]
    assert rows["slimpipe"].efficiency is None
    assert rows["fixed"].failed_steps == () and rows["fixed"].tokens_per_s > 0


def test_a_run_told_to_stop_at_its_first_failure_plans_nothing_after_it(monkeypatch):
    monkeypatch.setitem(STRATEGIES, "flaky", FailsOnStepOne)
    window = Window(warmup_steps=0, steps=4)
    whole = run_strategy("flaky", _config(), load_dataset("pydocs"), window)
    stopped = run_strategy("flaky", _config(), load_dataset("pydocs"), window, stop_at_first_failure=True)
    assert [s.step for s in whole.steps] == [0, 1, 2, 3]
    assert [s.step for s in stopped.steps] == [0, 1]
    assert stopped.metrics().failed_steps == whole.metrics().failed_steps == (1,)


def test_a_run_may_leave_the_idle_split_out_and_nothing_else():
    window = Window(warmup_steps=0, steps=2)
    full = run_strategy("kk", _config(), load_dataset("pydocs"), window)
    lean = run_strategy("kk", _config(), load_dataset("pydocs"), window, idle=False)
    assert all(s.idle is not None for s in full.steps) and all(s.idle is None for s in lean.steps)
    assert full.metrics().idle is not None and lean.metrics().idle is None
    measured = {f.name for f in dataclasses.fields(StrategyRow) if f.name.startswith("planner_")}  # wall clock
    same = {f.name for f in dataclasses.fields(StrategyRow)} - measured - {"idle"}
    assert {k: getattr(lean.metrics(), k) for k in same} == {k: getattr(full.metrics(), k) for k in same}


def test_a_drain_that_does_not_fit_counts_as_out_of_memory():
    # Qwen2.5-7B's 152K-token vocabulary on tp1 pp2: the last stage keeps ~2.7 MB per token, so no
    # step can hold the batch's 32K-token document. WLB defers it past the one-step window and its
    # drain step runs it alone, out of memory: that step is counted, not hidden in the drain.
    config = build_config(model="qwen2.5-7b", parallel=ParallelConfig(tp=1, pp=2, dp=2),
                          train=TrainConfig(max_context=32768, global_batch_tokens=65536, recompute="selective"))
    (run,) = compare(config, load_dataset("cpython"), ["wlb"], Window(warmup_steps=0, steps=1)).runs
    drain = run.in_phase("drain")
    assert [s.result.oom for s in run.in_phase("window")] == [False]
    assert drain and drain[0].result.oom
    assert run.metrics().oom_steps == (drain[0].step,)


def test_the_pieces_a_strategy_cuts_off_are_counted_and_none_on_a_corpus_chunked_to_the_context():
    window = Window(warmup_steps=0, steps=2)
    context = _config().train.max_context
    for name in ("fixed", "slimpipe", "slimpack", "bfd"):
        cut = run_strategy(name, _config(), load_dataset("pydocs"), window).metrics()
        chunked = run_strategy(name, _config(), load_dataset(
            f"synthetic:count=2000,median={context},sigma=0,tail_share=0,max_length={context}"), window).metrics()
        assert chunked.pieces_cut_off == 0
        assert (cut.pieces_cut_off > 0) == (name in ("fixed", "slimpipe"))


def test_with_cut_documents_every_strategy_trains_the_pieces_fixed_and_slimpipe_train(cli, capsys):
    window = Window(warmup_steps=0, steps=2)
    cut = dataclasses.replace(_config(), train=dataclasses.replace(_config().train, cut_documents=True))
    rows = {name: run_strategy(name, cut, load_dataset("pydocs"), window).metrics()
            for name in ("fixed", "slimpipe", "slimpack", "bfd")}
    assert {r.pieces_cut_off for r in rows.values()} == {0}
    assert len({r.window_tokens for r in rows.values()}) == 1  # one work basis: the same tokens, the same pieces
    for name in ("fixed", "slimpipe"):  # their own cut is the stream's: the same steps
        own = run_strategy(name, _config(), load_dataset("pydocs"), window).metrics()
        assert own.pieces_cut_off > 0 and own.tokens_per_s == rows[name].tokens_per_s
    assert cli(["compare", *SMALL, "--warmup", "0", "--steps", "2", "--strategies", "fixed,slimpack",
                "--cut-documents"]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    assert "documents cut where fixed-length sequences end (--cut-documents)" in terminal
    assert "cut documents at sequence boundaries (" not in terminal and "cuts documents" not in terminal


def test_compare_says_when_the_balanced_stage_split_would_lighten_the_slowest_stage(cli, capsys):
    llama3 = ["--model", "llama3-8b", "--dataset", "pydocs", "--max-context", "32K", "--global-batch-tokens", "512K",
              "--tp", "8", "--pp", "4", "--dp", "1", "--warmup", "0", "--steps", "1", "--strategies", "kk"]
    config = api.configure(model="llama3-8b", tp=8, pp=4, dp=1, max_context=32768, global_batch_tokens=2**19)
    lengths = [s.length for s in stream_batches(load_dataset("pydocs"), config, 1)[0]]
    work = stage_work(config, lengths)
    excess = max(work.stage_times((8, 8, 8, 8), pp=4)) / max(work.stage_times((8, 8, 9, 7), pp=4)) - 1
    assert excess > 0.01  # the 128K-vocabulary head on the last stage
    assert cli(["compare", *llama3]) == 0
    terminal = " ".join(capsys.readouterr().out.split())
    assert (f"the slowest stage's work is {excess:.1%} more with the even layer split than with --stage-layers "
            f"balanced (8/8/9/7, weighed by the first batch)") in terminal
    for quiet in (llama3 + ["--stage-layers", "balanced"], SMALL + ["--warmup", "0", "--steps", "1", "--strategies", "kk"]):
        assert cli(["compare", *quiet]) == 0  # balanced already; llama2-7b's 32K-vocabulary head splits evenly
        assert "pipeline stages:" not in capsys.readouterr().out
