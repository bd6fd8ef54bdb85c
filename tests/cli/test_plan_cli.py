"""``slimpack validate`` and ``slimpack simulate``: exit codes 0 / 1 (invalid plan) / 2 (not a plan),
outputs, and the trace and plot files."""

import json

import pytest

from slimpack.plan import plan_to_dict, save_plan
from slimpack.sim import simulate


@pytest.fixture
def plan_file(tmp_path, small_plan):
    path = tmp_path / "plan.json"
    save_plan(small_plan, path)
    return path


@pytest.fixture
def invalid_file(tmp_path, small_plan_dict):
    data = json.loads(json.dumps(small_plan_dict))
    data["pipelines"][0]["forward"][0].pop()  # a slice goes missing
    path = tmp_path / "invalid.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def malformed_file(tmp_path, small_plan_dict):
    data = dict(small_plan_dict, version=99)
    path = tmp_path / "malformed.json"
    path.write_text(json.dumps(data))
    return path


def test_validate_a_valid_plan(cli, plan_file, small_plan, capsys):
    assert cli(["validate", str(plan_file)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    tokens = sum(s.length for s in small_plan.samples)
    groups = sum(len(p.forward) for p in small_plan.pipelines)
    for fragment in ("valid plan", "strategy fixed", "2 pipeline(s)", "pp=2 dp=2", f"{groups} forward",
                     f"{len(small_plan.samples)} samples", f"{tokens} tokens"):
        assert fragment in out


@pytest.mark.parametrize("command", ["validate", "simulate"])
def test_an_invalid_plan_exits_1_with_the_checkers_message(cli, command, invalid_file, small_plan_dict, capsys):
    sid, start, end = small_plan_dict["pipelines"][0]["forward"][0][-1]
    assert cli([command, str(invalid_file)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"slimpack {command}: invalid plan: pipelines[0].forward: sample {sid} "
                            f"tokens [{start}, {end}) are in no group\n")


@pytest.mark.parametrize("command", ["validate", "simulate"])
def test_a_file_that_is_not_a_plan_exits_2(cli, command, malformed_file, tmp_path, capsys):
    assert cli([command, str(malformed_file)]) == 2
    assert "plan version 99 is not supported" in capsys.readouterr().err
    missing = tmp_path / "nope.json"
    assert cli([command, str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"slimpack {command}: error: cannot read plan") and err.count("\n") == 1
    (tmp_path / "text.json").write_text("plan?")
    assert cli([command, str(tmp_path / "text.json")]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_simulate_json_is_the_summary(cli, plan_file, small_plan, capsys):
    assert cli(["simulate", str(plan_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == simulate(small_plan).summary()


def test_simulate_report(cli, plan_file, small_plan, capsys):
    assert cli(["simulate", str(plan_file)]) == 0
    out = capsys.readouterr().out
    result = simulate(small_plan)
    for fragment in ("step time", f"{result.step_time_s:.4f} s", "ideal", f"{result.efficiency:.1%}", "bubble",
                     "tokens/s", "MFU", "peak memory", "usable GiB", "forward", "backward", "median"):
        assert fragment in out, fragment


def test_simulate_writes_trace_and_plots(cli, plan_file, small_plan, tmp_path, capsys):
    trace, chart, memory = tmp_path / "t.json", tmp_path / "g.png", tmp_path / "m.svg"
    argv = ["simulate", str(plan_file), "--json", "--trace", str(trace), "--gantt", str(chart), "--memory", str(memory)]
    assert cli(argv) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays pure JSON
    assert captured.err.splitlines() == [f"wrote {trace}", f"wrote {chart}", f"wrote {memory}"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(simulate(small_plan).spans)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert memory.read_text().lstrip().startswith("<?xml")


def test_simulate_refuses_a_plot_format_before_simulating(cli, plan_file, tmp_path, capsys):
    assert cli(["simulate", str(plan_file), "--gantt", str(tmp_path / "g.bmpx")]) == 2
    assert "--gantt" in capsys.readouterr().err
    assert not (tmp_path / "g.bmpx").exists()


def test_simulate_reports_oom(cli, tmp_path, small_plan, capsys):
    huge = plan_to_dict(small_plan)
    huge["config"]["cluster"]["memory_bytes"] = 4 * 2**30
    huge["config"]["cluster"]["reserved_memory_bytes"] = 2**30
    path = tmp_path / "oom.json"
    path.write_text(json.dumps(huge))
    assert cli(["simulate", str(path)]) == 2  # the figures, then one error line for scripts
    captured = capsys.readouterr()
    assert "OOM" in captured.out
    assert captured.err.startswith("slimpack simulate: error: out of memory: stage ") and captured.err.count("\n") == 1
    assert cli(["simulate", str(path), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["oom"] is True
