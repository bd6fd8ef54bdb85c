"""Every bad input a new user might give: one line on stderr, exit 2, no traceback, nothing on stdout
and no file written, refused before the work starts (issue 11's list)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from slimpack.compare import Window, compare
from slimpack.compare import report as report_module
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.data import load_dataset
from slimpack.plan import save_plan

SMALL_COMPARE = ["compare", "--dataset", "pydocs", "--max-context", "32K", "--global-batch-tokens", "256K",
                 "--tp", "8", "--pp", "2", "--dp", "2", "--warmup", "0", "--steps", "1", "--strategies", "fixed"]


@pytest.fixture
def files(tmp_path, small_plan):
    binary = tmp_path / "binary.json"
    binary.write_bytes(bytes(range(256)) * 4)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2, 3]\n")
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    plan = tmp_path / "plan.json"
    save_plan(small_plan, plan)
    no_sp = tmp_path / "no-sp.json"
    no_sp.write_text(json.dumps(build_config(model="tiny", parallel=ParallelConfig(tp=2, sequence_parallel=False))
                                .to_dict()))
    return {"BIN": str(binary), "LIST": str(listed), "OBJ": str(objects), "PLAN": str(plan), "NOSP": str(no_sp)}


def _bad_input(cli, capsys, tmp_path, argv, message):
    before = sorted(tmp_path.iterdir())
    assert cli(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, err
    assert sorted(tmp_path.iterdir()) == before  # nothing written


@pytest.mark.parametrize(("argv", "message"), [
    (["cost", "--tokens", "10", "--config", "BIN"], "is not a JSON text file"),
    (["cost", "--tokens", "10", "--config", "LIST"], "expected a JSON object"),
    (["validate", "BIN"], "is not a JSON text file"),
    (["simulate", "BIN"], "is not a JSON text file"),
    (["datasets", "OBJ"], "save the lengths as an integer array"),
    (["plan", "--dataset", "OBJ"], "save the lengths as an integer array"),
    ([*SMALL_COMPARE, "--report", "/proc/slimpack-report"], "--report /proc/slimpack-report: cannot write there"),
    ([*SMALL_COMPARE, "--json", "/sys/slimpack.json"], "--json /sys/slimpack.json: cannot write there"),
    (["simulate", "PLAN", "--trace", "/proc/x/trace.json"], "--trace /proc/x/trace.json: cannot write there"),
    (["plan", "--step", "-1"], "expected an integer >= 0"),
    (["compare", "--warmup", "-1"], "expected an integer >= 0"),
    (["compare", "--steps", "0"], "expected a positive integer"),
    (["plan", "--milp-time-limit", "nan"], "expected a finite number > 0"),
])
def test_planning_commands(cli, capsys, tmp_path, files, argv, message):
    _bad_input(cli, capsys, tmp_path, [files.get(a, a) for a in argv], message)


@pytest.mark.parametrize(("argv", "message"), [
    (["verify", "--plan", "BIN"], "is not a JSON text file"),
    (["verify", "--plan", "PLAN", "--device", "cuda"], "this torch sees no CUDA device"),
    (["verify", "--plan", "PLAN", "--device", "tpu"], "is not a torch device"),
    (["verify", "--plan", "PLAN", "--device", "xpu"], "the runtime runs on cpu or cuda"),
    (["verify", "--plan", "PLAN", "--device", "nonsense"], "is not a torch device"),
    (["verify", "--plan", "PLAN", "--model", "llama2-70b"], "use a smaller --model"),
    (["verify", "--plan", "PLAN", "--tolerance", "-1"], "expected a finite number > 0"),
    (["verify", "--plan", "PLAN", "--backend", "flash"], "--backend: attention backend 'flash' cannot run"),
    (["train", "--lr", "-1"], "expected a finite number > 0"),
    (["train", "--lr", "nan"], "expected a finite number > 0"),
    (["train", "--timeout", "0"], "expected a finite number > 0"),
    (["train", "--attention", "flash"], "--attention: attention backend 'flash' cannot run"),
    (["train", "--trace-dir", "/sys/slimpack-traces"], "--trace-dir /sys/slimpack-traces: cannot write there"),
    (["train", "--log-json", "/proc/x/log.json"], "--log-json /proc/x/log.json: cannot write there"),
    (["train", "--pp", "2"], "needs 2 processes"),
    (["train", "--config", "NOSP"], "tp=2 with sequence_parallel false"),
    (["fidelity", "--config", "NOSP"], "tp=2 with sequence_parallel false"),
])
def test_runtime_commands(cli, capsys, tmp_path, files, argv, message, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and "--device" in argv:
        pytest.skip("this machine has a CUDA device")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    _bad_input(cli, capsys, tmp_path, [files.get(a, a) for a in argv], message)


def test_prefix_takes_a_suffix_like_tokens(cli, capsys):
    assert cli(["cost", "--tokens", "8K", "--prefix", "120K", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prefix"] == 120 * 1024


def test_an_interrupted_report_leaves_nothing(tmp_path, monkeypatch):
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=2, dp=2),
                          train=TrainConfig(max_context=32768, global_batch_tokens=1 << 18))
    comparison = compare(config, load_dataset("pydocs"), ["fixed"], Window(warmup_steps=0, steps=1))

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report_module, "group_time_chart", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report_module.write_report(comparison, tmp_path / "report", command=["slimpack", "compare"])
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    report_module.write_report(comparison, tmp_path / "report", command=["slimpack", "compare"])
    assert [p.name for p in tmp_path.iterdir()] == ["report"]  # no staging folder left beside it
    assert (tmp_path / "report" / "report.html").stat().st_size > 1000
