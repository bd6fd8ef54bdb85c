"""``slimpack calibrate`` writes a loadable config for this machine; ``slimpack fidelity`` runs plans
for real and in the simulator (memory agrees closely: the cost model counts what the runtime keeps)."""

from __future__ import annotations

import json

import pytest

from slimpack.cli.main import main
from slimpack.config import load_config
from slimpack.config.model import ModelConfig
from slimpack.cost.calibrate import fit_efficiency
from slimpack.runtime.calibrate import collect_records, peak_flops


def run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_records_cover_every_op_and_fit():
    model = ModelConfig(name="t", num_layers=1, hidden=32, num_heads=2, num_kv_heads=1, ffn_hidden=64,
                        vocab_size=256, dtype_bytes=4)
    records = collect_records(model, gemm_tokens=(16, 64), attention_tokens=(16, 32), prefix_multiples=(0, 1),
                              layer_tokens=(32,), repeats=1)
    assert {r.op for r in records} == {"gemm", "attention", "layer"} and len(records) == 7
    assert all(r.time_s > 0 for r in records)
    assert fit_efficiency(records, model, peak_flops(size=256, repeats=1)).num_records == 7


@pytest.mark.slow
def test_calibrate_then_fidelity(tmp_path, capsys):
    calib = tmp_path / "calib.json"
    assert run_cli(["calibrate", "-o", str(calib), "--repeats", "1"]) == 0
    assert "fit error: MAPE" in capsys.readouterr().out
    config = load_config(calib)
    assert config.cluster.name == "measured-cpu" and config.cluster.peak_flops > 1e8
    assert run_cli(["fidelity", "--config", str(calib), "--strategies", "fixed", "--repeats", "1",
                    "--max-context", "256", "--global-batch-tokens", "1024", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (row,) = report["rows"]
    assert row["measured_step_s"] > 0 and row["predicted_step_s"] > 0
    assert report["memory_mape"] < 0.05


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("layout", ["--tp", "--cp"])
def test_fidelity_reports_tp_and_cp_communication(capsys, layout):
    """2 ranks, one stage: the cp collectives are exactly the cost model's; on the tp group the
    runtime also sends, per token, beyond the layers: the embedding's all-reduce (E elements) and the
    final norm's all-gather, re-gather and gradient reduce-scatter plus the layer input gradient's
    all-gather (E/2 each), i.e. 3 x E x 4 bytes per token and rank."""
    assert run_cli(["fidelity", "--strategies", "slimpack", "--repeats", "1", "--max-context", "256",
                    "--global-batch-tokens", "512", layout, "2", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    label = layout[2:]
    assert set(row["measured_comm_bytes"]) == set(row["predicted_comm_bytes"]) == {label}
    predicted, measured = row["predicted_comm_bytes"][label], row["measured_comm_bytes"][label]
    if label == "cp":
        assert predicted == pytest.approx(measured, rel=1e-9)
    else:
        hidden, ranks = 64, 2
        outside_layers = row["tokens"] * 3 * hidden * 4 * ranks
        assert measured - predicted == pytest.approx(outside_layers, rel=0.02)
    assert abs(row["measured_activation_bytes"] / row["predicted_activation_bytes"] - 1) < 0.02
