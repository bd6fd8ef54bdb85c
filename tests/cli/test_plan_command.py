"""``slimpack plan``: writes a valid plan for any strategy, honours the ablation switches, and
replays earlier steps for strategies that carry state."""

import json

import pytest

from slimpack.plan import load_plan
from slimpack.plan.check import check_plan

SMALL = ["--dataset", "pydocs", "--max-context", "32K", "--global-batch-tokens", "256K", "--tp", "8",
         "--pp", "2", "--dp", "2"]


@pytest.mark.parametrize("strategy", ["fixed", "slimpack", "bfd", "kk", "wlb", "slimpipe", "bytescale"])
def test_every_strategy_writes_a_valid_plan(cli, tmp_path, strategy):
    out = tmp_path / "p.json"
    assert cli(["plan", *SMALL, "--strategy", strategy, "--step", "1", "-o", str(out)]) == 0
    plan = load_plan(out)
    check_plan(plan)
    assert plan.strategy == strategy and plan.step == 1


def test_ablation_switches_reach_the_planner(cli, tmp_path):
    out = tmp_path / "p.json"
    assert cli(["plan", *SMALL, "--no-slicing", "--no-asymmetric", "--milp", "-o", str(out)]) == 0
    plan = load_plan(out)
    assert not plan.config.planner.use_slicing and not plan.config.planner.use_asymmetric
    assert plan.config.planner.use_milp and plan.info["milp"] is not None  # the MILP ran (off by default)
    assert all(len([s for g in p.forward for s in g if s.sample_id == sid]) == 1
               for p in plan.pipelines for sid in {s.sample_id for g in p.forward for s in g})


def test_a_switch_flag_overrides_the_config_file_and_leaves_it_alone_otherwise(cli, tmp_path):
    first, second, config = tmp_path / "on.json", tmp_path / "off.json", tmp_path / "config.json"
    assert cli(["plan", *SMALL, "--milp", "-o", str(first)]) == 0
    config.write_text(json.dumps(json.loads(first.read_text())["config"]))
    assert cli(["plan", "--config", str(config), "--dataset", "pydocs", "-o", str(second)]) == 0
    assert load_plan(second).config.planner.use_milp  # the file's setting stands
    assert cli(["plan", "--config", str(config), "--dataset", "pydocs", "--no-milp", "-o", str(second)]) == 0
    plan = load_plan(second)
    own = plan.info.get("slimpack", plan.info)  # SlimPack's own plan's info, also where a candidate won
    assert not plan.config.planner.use_milp and own["milp"] is None


def test_a_micro_batch_token_cap_reaches_the_baselines(cli, tmp_path):
    out = tmp_path / "p.json"
    assert cli(["plan", *SMALL, "--strategy", "bfd", "--micro-batch-tokens", "128K", "-o", str(out)]) == 0
    plan = load_plan(out)
    check_plan(plan)
    assert plan.config.train.micro_batch_tokens == 128 * 1024
    groups = [sum(s.tokens for s in g) for p in plan.pipelines for g in p.forward]
    assert max(groups) > 32 * 1024 and max(groups) <= 128 * 1024  # fuller than one context, within the cap


def test_a_stage_split_reaches_the_plan(cli, tmp_path, capsys):
    out = tmp_path / "p.json"
    llama3 = ["--model", "llama3-8b", "--dataset", "pydocs", "--max-context", "32K", "--global-batch-tokens",
              "512K", "--tp", "8", "--pp", "4", "--dp", "1", "-o", str(out)]
    assert cli(["plan", *llama3, "--stage-layers", "9,8,8,7"]) == 0
    said = " ".join(capsys.readouterr().err.split())  # the console wraps its lines
    assert "pipeline(s) on tp=8 pp=4 dp=1 cp=1 (32 GPUs), layers per chunk 9/8/8/7," in said
    plan = load_plan(out)
    check_plan(plan)
    assert plan.config.parallel.stage_layers == (9, 8, 8, 7)
    assert cli(["plan", *llama3, "--stage-layers", "balanced"]) == 0  # weighed by pydocs' first batch
    assert load_plan(out).config.parallel.stage_layers == (8, 8, 9, 7)
    assert cli(["plan", *llama3, "--pp", "3", "--stage-layers", "balanced"]) == 0  # 32 layers over 3 stages
    assert load_plan(out).config.parallel.pp == 3 and sum(load_plan(out).config.parallel.stage_layers) == 32
    capsys.readouterr()
    for split, message in (("9,8,x", "expected 'even', 'balanced' or layers per pipeline chunk"),
                           ("9,8,8,0", "each >= 1"),
                           ("9,8,8", "stage_layers has 3 entries, expected pp*virtual_stages = 4"),
                           ("9,9,9,9", "sum to 36 layers, llama3-8b has 32")):
        assert cli(["plan", *llama3, "--stage-layers", split]) == 2
        assert message in capsys.readouterr().err


def test_wlb_replays_earlier_steps_for_its_queues(cli, tmp_path):
    # 64K context, 1M-token batches of wlbllm: WLB defers outliers at step 0 and brings them back
    args = ["--dataset", "wlbllm", "--max-context", "64K", "--global-batch-tokens", "1M", "--tp", "8",
            "--pp", "2", "--dp", "2", "--strategy", "wlb"]
    first, second = tmp_path / "0.json", tmp_path / "1.json"
    assert cli(["plan", *args, "--step", "0", "-o", str(first)]) == 0
    assert cli(["plan", *args, "--step", "1", "-o", str(second)]) == 0
    held = set(load_plan(first).deferred)
    assert held, "step 0 should defer an outlier in this setting"
    assert held <= {s.id for s in load_plan(second).samples}


def test_bad_plan_flags(cli, capsys):
    assert cli(["plan", *SMALL, "--strategy", "nope"]) == 2
    assert cli(["plan", *SMALL, "--step", "-1"]) == 2
    assert "unknown strategy 'nope'" in capsys.readouterr().err
