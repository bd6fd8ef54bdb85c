"""``slimpack tune`` end to end: table, JSON, report with chart, a winning config that compare reads;
bad input is one line and exit 2."""

import json

import pytest

from slimpack.cli.main import main
from slimpack.config import load_config
from slimpack.tune.search import _Search

SMALL = ["tune", "--gpus", "4", "--model", "llama2-7b", "--max-context", "16K", "--global-batch-tokens", "128K",
         "--strategies", "fixed,kk"]


def test_tune_writes_table_json_report_and_a_usable_config(tmp_path, capsys):
    out = tmp_path / "best.json"
    assert main([*SMALL, "--json", "-", "--report", str(tmp_path / "rep"), "--output", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["strategy"]: r for r in data["strategies"]}
    assert set(rows) == {"fixed", "kk"}
    assert rows["fixed"]["vs_best_fixed"] == 1.0 and rows["kk"]["tokens_per_s"] > 0
    assert rows["kk"]["simulated"] + rows["kk"]["pruned"] + rows["kk"]["failed"] > rows["kk"]["simulated"]
    config = load_config(out)
    assert config.parallel.num_devices == 4
    assert config.to_dict() == data["best_config"]
    for name in ("tune.md", "tune.json", "tune.png", "best-fixed.json", "best-kk.json"):
        assert (tmp_path / "rep" / name).stat().st_size > 0
    assert main(["compare", "--config", str(out), "--steps", "1", "--strategies", "fixed", "--json", "-"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["strategies"]
    assert row["tokens_per_s"] > 0


def test_the_baselines_micro_batch_cap_reaches_the_search_and_its_config(tmp_path, capsys):
    out = tmp_path / "best.json"
    assert main([*SMALL, "--micro-batch-tokens", "64K", "--confirm", "0", "--json", "-", "--output", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["best_config"]["train"]["micro_batch_tokens"] == 64 * 1024
    assert load_config(out).train.micro_batch_cap == 64 * 1024


def test_a_time_limit_is_reported_with_its_ceiling(capsys):
    assert main([*SMALL, "--time-limit", "0", "--confirm", "0", "--json", "-", "--output", "/dev/null"]) == 0
    captured = capsys.readouterr()
    rows = {r["strategy"]: r for r in json.loads(captured.out)["strategies"]}
    for name, row in rows.items():
        assert row["not_screened"] > 0 and row["unscreened_ceiling_tokens_per_s"] > 0
        assert f"{name}: {row['not_screened']} layouts not screened (time limit)" in captured.err


def test_front_runners_the_time_limit_leaves_unconfirmed_are_reported(monkeypatch, capsys):
    # every window estimated to end past the limit: each strategy runs its front runners over the
    # window until one fits there, and lists the rest as not confirmed
    monkeypatch.setattr(_Search, "window_estimate_s", lambda self, rank: 1e9)
    assert main([*SMALL, "--time-limit", "3600", "--workers", "1", "--json", "-", "--output", "/dev/null"]) == 0
    captured = capsys.readouterr()
    rows = {r["strategy"]: r for r in json.loads(captured.out)["strategies"]}
    assert rows["kk"]["unconfirmed"]
    for name, row in rows.items():
        assert [c["status"] == "simulated" for c in row["confirmed"]][-1:] == [True]
        assert sum(c["status"] == "simulated" for c in row["confirmed"]) == 1
        if row["unconfirmed"]:
            assert f"{name}: {len(row['unconfirmed'])} front runner(s) not confirmed (time limit)" in captured.err


@pytest.mark.parametrize(("argv", "message"), [
    (["tune", "--gpus", "0"], "expected a positive integer"),
    (["tune", "--gpus", str(2**20 + 1)], "--gpus 1048577: at most 2**20 (1,048,576) GPUs are laid out"),
    (["tune", "--gpus", "8", "--strategies", "nope"], "unknown strategy 'nope'"),
    (["tune", "--gpus", "8", "--time-limit", "-1"], "expected a finite number >= 0"),
    (["tune", "--gpus", "8", "--model", "gpt-9"], "unknown model"),
    (["tune", "--gpus", "1", "--model", "llama2-70b", "--max-context", "4K"], "no layout of 1 GPUs can hold"),
    (["tune", "--gpus", "8", "--dataset", "no-such-data"], "no-such-data"),
    (["tune", "--gpus", "8", "--max-context", "16K", "--micro-batch-tokens", "8K"], "micro_batch_tokens must be at least"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse rejects the flag itself
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
