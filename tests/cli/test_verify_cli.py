"""``slimpack verify``: exit codes and messages (0 pass, 1 mismatch or unexecutable plan, 2 usage)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slimpack.cli.main import main
from slimpack.config import ParallelConfig, build_config
from slimpack.plan import save_plan
from slimpack.plan.types import Action, PipelinePlan, Plan, Sample, Slice

pytest.importorskip("torch")

S = Slice
FORWARD = ((S(0, 0, 10), S(1, 0, 7)), (S(0, 10, 30), S(2, 0, 5)), (S(0, 30, 41), S(1, 7, 20)))
BACKWARD = ((S(1, 7, 20), S(0, 30, 41), S(0, 10, 30)), (S(2, 0, 5),), (S(0, 0, 10), S(1, 0, 7)))
SAMPLES = (Sample(id=0, length=41), Sample(id=1, length=20), Sample(id=2, length=5), Sample(id=3, length=33))


def write_plan(path: Path, *, order=None, deferred=(), extra=(), pp=2) -> str:
    """A plan for a big model (its shape does not matter: verify runs the tiny one), two pipelines."""
    config = build_config(model="llama2-7b", parallel=ParallelConfig(pp=pp, dp=2))
    orders = None if order is None else tuple(tuple(Action.parse(a) for a in row) for row in order)
    plan = Plan(config=config, strategy="hand", samples=SAMPLES + tuple(extra), deferred=deferred, pipelines=(
        PipelinePlan(replicas=(0,), cp=1, forward=FORWARD, backward=BACKWARD, order=orders),
        PipelinePlan(replicas=(1,), cp=1, forward=((S(3, 0, 33),),), backward=((S(3, 0, 33),),))))
    save_plan(plan, path / "plan.json")
    return str(path / "plan.json")


def test_verify_passes(tmp_path, capsys) -> None:
    order = [["F0", "F1", "F2", "B0", "B1", "B2"]] * 2
    plan = write_plan(tmp_path, order=order, deferred=(9,), extra=(Sample(id=9, length=100_000),))
    assert main(["verify", "--plan", plan]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "layers.3.w_down" in out and "2 run in the plan's order" in out


def test_float32_against_a_float64_tolerance_fails(tmp_path, capsys) -> None:
    plan = write_plan(tmp_path)
    assert main(["verify", "--plan", plan, "--dtype", "float32", "--tolerance", "1e-12"]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_an_order_that_breaks_a_dependency_fails(tmp_path, capsys) -> None:
    plan = write_plan(tmp_path, order=[["F0", "F1", "F2", "B2", "B1", "B0"]] * 2)
    assert main(["verify", "--plan", plan]) == 1
    assert "needs the backward of later slice" in capsys.readouterr().out


def test_too_many_tokens_for_a_cpu(tmp_path, capsys) -> None:
    plan = str(tmp_path / "big.json")
    config = build_config(model="llama2-7b", parallel=ParallelConfig(pp=1))
    big = Plan(config=config, strategy="hand", samples=(Sample(id=9, length=70_000),), pipelines=(
        PipelinePlan(replicas=(0,), cp=1, forward=((S(9, 0, 70_000),),), backward=((S(9, 0, 70_000),),)),))
    save_plan(big, plan)
    assert main(["verify", "--plan", plan]) == 2
    err = capsys.readouterr().err
    assert "70000 tokens" in err and "--force" in err and len(err.strip().splitlines()) == 1


def test_without_torch_the_message_says_what_to_install(tmp_path) -> None:
    plan = write_plan(tmp_path)
    code = ("import sys; sys.modules['torch'] = None\n"
            "from slimpack.cli.main import main\n"
            f"sys.exit(main(['verify', '--plan', {plan!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "slimpack verify: error: slimpack verify needs PyTorch: install slimpack[torch]"


def test_verify_runs_a_hugging_face_config_in_bf16(tmp_path, capsys) -> None:
    """--model config.json runs transformers' own model; --precision bf16 checks bf16 compute with
    float32 master gradients against float32."""
    pytest.importorskip("transformers")
    config = {"model_type": "qwen2", "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 40, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = write_plan(tmp_path)
    assert main(["verify", "--plan", plan, "--model", str(tmp_path / "config.json"), "--precision", "bf16"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "k_proj.bias" in out and "float32, bf16 compute" in out
    assert "the unsliced bf16 run's worst is" in out and "PASSED" in out
