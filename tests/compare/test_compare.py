import json

import pytest

from slimpack.compare import compare
from slimpack.config import ParallelConfig, PlannerConfig, TrainConfig, build_config
from slimpack.data import load_dataset
from slimpack.strategies import STRATEGIES
from slimpack.strategies.fixed import FixedPlanner

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


def test_every_strategy_sees_the_same_tokens_and_fixed_is_the_baseline():
    comparison = compare(_config(), load_dataset("pydocs"), ["fixed", "slimpack", "wlb"], 3)
    rows = {r["strategy"]: r for r in comparison.table()}
    assert rows["fixed"]["speedup_vs_fixed"] == 1.0
    tokens = {name: sum(s.scheduled_tokens for s in run.steps) for name, run in
              ((run.name, run) for run in comparison.runs)}
    assert len(set(tokens.values())) == 1  # wlb drains what it deferred
    for row in rows.values():
        assert row["steps"] == 3 and not row["failed_steps"]
        assert 0 < row["efficiency"] <= 1 and row["tokens_per_s"] > 0
        assert row["step_time_p95_s"] >= row["step_time_mean_s"] * 0.5


def test_a_strategy_failing_on_one_step_is_reported_and_the_others_go_on(monkeypatch):
    monkeypatch.setitem(STRATEGIES, "flaky", FailsOnStepOne)
    comparison = compare(_config(), load_dataset("pydocs"), ["fixed", "flaky"], 3)
    rows = {r["strategy"]: r for r in comparison.table()}
    assert rows["flaky"]["failed_steps"] == [1] and "boom" in rows["flaky"]["errors"][0]
    assert rows["fixed"]["failed_steps"] == []
    assert rows["flaky"]["tokens_per_s"] > 0


def test_cli_json_and_report(cli, tmp_path, capsys):
    out = tmp_path / "c.json"
    report = tmp_path / "report"
    assert cli(["compare", *SMALL, "--steps", "2", "--strategies", "fixed,slimpack", "--json", str(out),
                "--report", str(report)]) == 0
    data = json.loads(out.read_text())
    keys = {"strategy", "tokens_per_s", "step_time_mean_s", "step_time_p95_s", "speedup_vs_fixed", "efficiency",
            "bubble_fraction", "peak_memory_bytes", "memory_capacity_bytes", "oom_steps", "planner_time_p50_s",
            "mean_delay_steps_per_token", "failed_steps"}
    assert all(keys <= set(row) for row in data["strategies"])
    for name in ("report.md", "report.html", "throughput.png", "step_throughput.png", "gantt.png",
                 "group_times.png", "memory.png"):
        assert (report / name).stat().st_size > 1000
    html = (report / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5
    report_text = (report / "report.md").read_text()
    # the title block says what the figures are and on which assumptions; the idle split is there
    assert "# slimpack comparison (simulated)" in report_text and "**Simulated**, not measured" in report_text
    assert "fa3 kernels: GEMM 0.75 of peak" in report_text and "| strategy | fill/drain |" in report_text
    assert "slimpack compare" in (report / "report.md").read_text()


@pytest.mark.parametrize(("argv", "message"), [
    (["--strategies", "fixed,nope"], "unknown strategy 'nope'"),
    (["--model", "gpt9"], "unknown model 'gpt9'"),
    (["--dataset", "no-such-data"], "no-such-data"),
    (["--pp", "3"], "not divisible by pp"),
    (["--max-context", "8M"], "max_context"),
    (["--model", "llama2-70b", "--tp", "1", "--pp", "1"], "does not fit on h100-sxm"),
])
def test_bad_flags_give_one_line_and_exit_2(cli, capsys, argv, message):
    assert cli(["compare", *SMALL, "--steps", "1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


def test_slimpack_beats_every_baseline_on_a_long_tailed_batch():
    # one 4M-token wlbllm batch at 128K on 64 simulated H100s (the demo's layout): a quality
    # regression check, deterministic (the MILP is off so no wall-clock limit can change the plan)
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=4, dp=2),
                          train=TrainConfig(max_context=131072, global_batch_tokens=4 << 20),
                          planner=PlannerConfig(use_milp=False))
    rows = {r["strategy"]: r for r in compare(config, load_dataset("wlbllm"), list(STRATEGIES), 1).table()}
    ours = rows.pop("slimpack")
    assert ours["schedule_efficiency"] > 0.9  # its own work packs well...
    assert 0.0 < ours["extra_work_fraction"] < 1.0  # ...and is more than the whole-document ideal
    for name, row in rows.items():
        # slimpipe with cost-balanced slices comes within a few per cent on this one batch
        assert ours["tokens_per_s"] > (1.0 if name == "slimpipe" else 1.1) * row["tokens_per_s"], name
        assert ours["efficiency"] > row["efficiency"], name  # one ideal for all: ranks like throughput


def test_a_strategy_that_cannot_run_the_layout_fails_alone():
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=2, dp=2, virtual_stages=2),
                          train=TrainConfig(max_context=32768, global_batch_tokens=1 << 18))
    rows = {r["strategy"]: r for r in compare(config, load_dataset("pydocs"), ["fixed", "slimpipe"], 2).table()}
    assert rows["slimpipe"]["failed_steps"] == [0, 1] and "virtual_stages" in rows["slimpipe"]["errors"][0]
    assert rows["slimpipe"]["efficiency"] is None
    assert rows["fixed"]["failed_steps"] == [] and rows["fixed"]["tokens_per_s"] > 0
