"""``slimpack train`` in one process (pp = dp = 1) and its refusal without torchrun."""

from __future__ import annotations

import json

from slimpack.cli.main import main


def run_cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_train_one_process_logs_and_writes_a_trace(tmp_path, capsys):
    log = tmp_path / "log.json"
    code = run_cli(["train", "--steps", "2", "--max-context", "256", "--global-batch-tokens", "1024",
                    "--strategy", "fixed", "--trace-dir", str(tmp_path), "--log-json", str(log)])
    assert code == 0
    out = capsys.readouterr().out
    assert "step 1: loss" in out and "tokens/s" in out and "planner" in out
    records = json.loads(log.read_text())
    assert [r["step"] for r in records] == [0, 1]
    assert 0 < records[1]["loss"] < records[0]["loss"] < 6.5  # ln 256 = 5.55 at the start, then learning
    trace = json.loads((tmp_path / "rank0.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"F0", "B0", "grad sync", "optimizer"} <= names


def test_train_needs_torchrun_for_several_ranks(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert run_cli(["train", "--pp", "2"]) == 2
    assert "torchrun --nproc-per-node 2" in capsys.readouterr().err


def test_train_a_hugging_face_config_in_bf16(tmp_path, capsys):
    """transformers' Llama from a config.json, bf16 compute with float32 master weights: it learns."""
    import pytest

    pytest.importorskip("transformers")
    config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    log = tmp_path / "log.json"
    code = run_cli(["train", "--model", str(tmp_path / "config.json"), "--precision", "bf16", "--steps", "3",
                    "--lr", "1e-2", "--max-context", "256", "--global-batch-tokens", "1024", "--max-files", "5",
                    "--log-json", str(log)])
    assert code == 0
    assert "transformers' " in capsys.readouterr().out
    losses = [r["loss"] for r in json.loads(log.read_text())]
    assert losses[2] < losses[0] < 6.0  # ln 256 = 5.55 at the start, then learning


def test_train_runs_fixeds_pieces_when_the_stream_cuts_them(capsys):
    """fixed cuts documents at sequence boundaries into pieces train has no text for (step 1 here);
    with --cut-documents the stream makes those pieces, with their text, for any strategy."""
    argv = ["train", "--steps", "2", "--max-context", "1000", "--global-batch-tokens", "4000", "--strategy", "fixed"]
    assert run_cli(argv) == 2
    assert "--cut-documents cuts the documents in the data stream" in capsys.readouterr().err
    assert run_cli([*argv, "--cut-documents"]) == 0
    assert "step 1: loss" in capsys.readouterr().out
