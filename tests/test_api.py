"""slimpack.api: the functions give what the commands give (they share the code), and refuse bad
values with one UserError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slimpack import api
from slimpack.config import MODEL_PRESETS, ParallelConfig, TrainConfig, build_config
from slimpack.cost.stages import balanced_stage_layers
from slimpack.errors import UserError
from slimpack.plan import plan_to_dict
from slimpack.strategies.stream import stream_batches

HF_CONFIGS = Path(__file__).parent / "config" / "hf_configs"


def test_configure_overrides_what_is_given_and_keeps_the_rest(tmp_path):
    base = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=4, dp=2),
                        train=TrainConfig(max_context=65536, seed=3))
    config = api.configure(base, pp=2, dp=4, global_batch_tokens=2**21, kernels="fa2",
                           planner={"use_slicing": False})
    assert (config.parallel.tp, config.parallel.pp, config.parallel.dp) == (8, 2, 4)
    assert (config.train.max_context, config.train.global_batch_tokens, config.train.seed) == (65536, 2**21, 3)
    assert config.efficiency.kernels == "fa2" and config.efficiency.attention_max == 0.35
    assert config.planner.use_slicing is False and config.planner.use_asymmetric is True
    assert api.configure(base) == base
    # a Hugging Face config.json gives the preset's shape; a config file is a start as well
    (tmp_path / "Meta-Llama-3-8B").mkdir()
    shutil.copy(HF_CONFIGS / "Meta-Llama-3-8B.json", tmp_path / "Meta-Llama-3-8B" / "config.json")
    hf = api.configure(model=str(tmp_path / "Meta-Llama-3-8B"))
    assert hf.model.to_dict() | {"name": "llama3-8b"} == MODEL_PRESETS["llama3-8b"].to_dict()
    api.save_config(config, tmp_path / "c.toml")
    assert api.configure(str(tmp_path / "c.toml"), dp=1).parallel.dp == 1


def test_configure_takes_a_stage_split_even_or_balanced(tmp_path):
    base = api.configure(model="llama3-8b", tp=8, pp=4, dp=2, max_context=65536)
    assert api.configure(base, stage_layers=(9, 8, 8, 7)).parallel.stage_layers == (9, 8, 8, 7)
    # on one 64K-token sample attention outweighs the 128K-vocabulary head: even; on a batch of
    # wikipedia's mostly short documents the head weighs in and the last stage gets a layer less
    balanced = api.configure(base, stage_layers="balanced")
    assert balanced.parallel.stage_layers == balanced_stage_layers(api.configure(base, pp=1), pp=4) == (8, 8, 8, 8)
    weighed = api.balance_stages(balanced, "wikipedia")
    lengths = [s.length for s in stream_batches(api.dataset("wikipedia"), balanced, 1)[0]]
    assert weighed.parallel.stage_layers == balanced_stage_layers(balanced, lengths) == (8, 8, 9, 7)
    assert api.configure(weighed, stage_layers="even").parallel.stage_layers == ()
    assert api.configure(weighed).parallel.stage_layers == (8, 8, 9, 7)  # kept unless given
    # a layout whose layers do not divide: no even split, a balanced one; pp and vpp from a config file too
    api.save_config(api.configure(base, pp=1), tmp_path / "c.json")
    three = api.configure(str(tmp_path / "c.json"), pp=3, stage_layers="balanced")
    assert three.parallel.pp == 3 and sum(three.parallel.stage_layers) == 32
    interleaved = api.configure(base, pp=2, vpp=2, stage_layers="balanced").parallel
    assert len(interleaved.stage_layers) == 4 and sum(interleaved.stage_layers) == 32
    with pytest.raises(UserError, match="not divisible by pp\\*virtual_stages = 3\\*1 = 3"):
        api.configure(base, pp=3, stage_layers="even")
    with pytest.raises(UserError, match="stage_layers has 4 entries, expected pp\\*virtual_stages = 2"):
        api.configure(weighed, pp=2)
    with pytest.raises(UserError, match="expected layers per pipeline chunk, 'even' or 'balanced', got 'uneven'"):
        api.configure(base, stage_layers="uneven")


@pytest.mark.parametrize(("call", "message"), [
    (lambda: api.configure(planner={"use_slicng": False}), "unknown planner setting(s) use_slicng"),
    (lambda: api.configure(model="llama9"), "unknown model 'llama9'"),
    (lambda: api.plan_batch([1000, 70000], api.configure(max_context=65536), "kk"),
     "1 length(s) exceed the 65536-token context (longest 70000)"),
    (lambda: api.plan_batch([], api.configure(), "kk"), "at least one length"),
    (lambda: api.plan_batch([100], api.configure(), "best"), "unknown strategy 'best'"),
    (lambda: api.compare("wikipedia", api.configure(), ["kk"], steps=0), "--steps (the measured window) must be >= 1"),
    (lambda: api.dataset("no-such-set"), "unknown dataset 'no-such-set'"),
])
def test_bad_values_are_one_user_error(call, message):
    with pytest.raises(UserError) as caught:
        call()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_plan_batch_plans_exactly_the_lengths_given():
    config = api.configure(tp=8, pp=2, dp=2, max_context=16384, global_batch_tokens=2**20)
    lengths = [16384, 9000, 5000, 3000, 1200, 800, 800, 300]
    plan = api.plan_batch(lengths, config, "kk", step=5)
    assert [s.length for s in plan.samples] == lengths and plan.step == 5
    trained = sum(s.end - s.start for p in plan.pipelines for g in p.forward for s in g)
    assert trained == sum(lengths)
    result = api.simulate(plan)
    assert result.ideal_time_s < result.step_time_s and result.efficiency == pytest.approx(
        result.ideal_time_s / result.step_time_s)


def test_plan_step_is_what_slimpack_plan_writes(cli, tmp_path, capsys):
    argv = ["--dataset", "pydocs", "--max-context", "32K", "--global-batch-tokens", "512K", "--tp", "8",
            "--pp", "2", "--dp", "2"]
    assert cli(["plan", "--strategy", "kk", "--step", "2", *argv, "-o", str(tmp_path / "p.json")]) == 0
    assert "pydocs: 4 of 497 documents longer than the 32768-token context" in " ".join(capsys.readouterr().err.split())
    config = api.configure(tp=8, pp=2, dp=2, max_context=32768, global_batch_tokens=2**19)
    planned = api.plan_step("pydocs", config, "kk", step=2)
    assert plan_to_dict(planned.plan) == json.loads((tmp_path / "p.json").read_text())


def test_compare_follows_the_window_protocol():
    config = api.configure(tp=8, pp=2, dp=2, max_context=32768, global_batch_tokens=2**19)
    comparison = api.compare("pydocs", config, ["fixed", "wlb"], warmup=2, steps=3)
    fixed, wlb = comparison.runs
    # a stateless strategy skips the warm-up; a stateful one (wlb's queues) runs it unmeasured
    assert [(s.step, s.phase) for s in fixed.steps] == [(2, "window"), (3, "window"), (4, "window")]
    assert [s.phase for s in wlb.steps][:5] == ["warmup", "warmup", "window", "window", "window"]
    assert comparison.context_cut.num_cut_docs == 4 and comparison.table()[0].speedup_vs_fixed == 1.0


def test_tune_finds_the_layout_slimpack_tune_writes(cli, tmp_path):
    # 2 GPUs, 16K context: a small search; the API and the command give the same winning config
    base = api.configure(model="llama2-7b", max_context=16384, global_batch_tokens=2**17)
    result = api.tune("wikipedia", base, 2, ["fixed", "kk"])
    assert {s.strategy for s in result.strategies} == {"fixed", "kk"}
    winner = result.best_config()
    assert winner is not None and winner.parallel.num_devices == 2
    assert cli(["tune", "--gpus", "2", "--model", "llama2-7b", "--max-context", "16K", "--global-batch-tokens",
                "128K", "--strategies", "fixed,kk", "--workers", "1", "--output", str(tmp_path / "w.json")]) == 0
    assert api.load_config(tmp_path / "w.json") == winner
