import json

import pytest

from slimpack.cli.main import main


def test_cost_json_has_per_layer_and_model(capsys):
    assert main(["cost", "--model", "llama2-7b", "--tokens", "8192", "--prefix", "122880", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for part in ("per_layer", "model"):
        assert {"forward_flops", "backward_flops", "forward_time_s", "backward_time_s",
                "activation_bytes"} <= set(report[part])
    assert report["per_layer"]["forward_flops"] == pytest.approx(2.0358e13, rel=1e-4)
    assert report["model"]["forward_flops"] == pytest.approx(32 * 2.0358e13, rel=1e-4)
    assert report["model"]["backward_time_s"] > report["model"]["forward_time_s"]


def test_cost_table_and_tp(capsys):
    assert main(["cost", "--model", "llama2-70b", "--tokens", "16K", "--tp", "8"]) == 0
    out = capsys.readouterr().out
    assert "llama2-70b" in out and "tp=8" in out and "80 layers" in out


@pytest.mark.parametrize("argv", [
    ["cost", "--model", "nope", "--tokens", "10"],
    ["cost", "--tokens", "10", "--tp", "3"],
    ["cost", "--tokens", "10", "--prefix", "-1"],
    ["cost", "--tokens", "zero"],
    ["cost", "--tokens", "10", "--config", "/does/not/exist.json"],
])
def test_bad_input_is_one_line_and_exit_2(argv, cli, capsys):
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err and "Traceback" not in err
