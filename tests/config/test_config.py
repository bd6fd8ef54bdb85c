import dataclasses
import json

import pytest

from slimpack.config import (
    CLUSTER_PRESETS,
    MODEL_PRESETS,
    Config,
    ParallelConfig,
    TrainConfig,
    build_config,
    load_config,
    model_preset,
    save_config,
)
from slimpack.errors import UserError


@pytest.mark.parametrize(("name", "billions"), [("llama2-7b", 6.74), ("llama2-13b", 13.0), ("llama2-70b", 68.98),
                                                ("llama3-8b", 8.03), ("llama3-70b", 70.55),
                                                ("qwen2.5-7b", 7.62), ("qwen2.5-32b", 32.5), ("qwen2.5-72b", 72.7),
                                                ("llama3.2-1b", 1.24), ("llama3.2-3b", 3.21),
                                                ("qwen2.5-1.5b", 1.54), ("qwen2.5-3b", 3.09)])
def test_preset_parameter_counts_match_published_sizes(name, billions):
    # Qwen2.5 has small QKV biases that the shape model leaves out (<0.01%); the 1B-3B models
    # count their tied head once
    assert model_preset(name).num_params() / 1e9 == pytest.approx(billions, rel=0.01)


def test_required_presets_exist():
    assert {"llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "qwen2.5-7b", "qwen2.5-32b",
            "qwen2.5-72b", "tiny"} <= set(MODEL_PRESETS)
    assert {"h100-sxm", "h200", "a100-80g"} <= set(CLUSTER_PRESETS)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_config_round_trips_through_files(tmp_path, suffix):
    config = build_config(model="llama2-70b", gpu="h200",
                          parallel=ParallelConfig(tp=8, pp=4, dp=2, cp=2, virtual_stages=2),
                          train=TrainConfig(max_context=131072, recompute="full"))
    path = tmp_path / f"c{suffix}"
    save_config(config, path)
    assert load_config(path) == config
    assert Config.from_dict(config.to_dict()) == config


def test_config_file_may_name_presets(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"model": "llama3-8b", "cluster": "a100-80g", "parallel": {"tp": 2}}))
    config = load_config(path)
    assert config.model == model_preset("llama3-8b") and config.parallel.tp == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"model": "gpt-9"}, "unknown model 'gpt-9'; valid: llama2-13b"),
    ({"gpu": "tpu"}, "unknown gpu 'tpu'; valid: a100-80g"),
    ({"parallel": ParallelConfig(pp=3)}, "32 layers, not divisible by pp*virtual_stages = 3*1 = 3"),
    ({"model": "llama2-70b", "parallel": ParallelConfig(tp=16)}, "not divisible by tp=16"),
    ({"model": "qwen2.5-7b", "parallel": ParallelConfig(pp=8)}, "28 layers, not divisible by pp"),
    ({"model": "llama3-8b", "parallel": ParallelConfig(tp=16)}, "8 KV heads, not divisible by tp=16"),
])
def test_invalid_layouts_explain_what_is_wrong(kwargs, message):
    with pytest.raises(UserError, match=message.replace("*", r"\*").replace("(", r"\(")):
        build_config(**kwargs)


def test_field_validation_and_unknown_keys():
    with pytest.raises(UserError, match="tp must be an integer >= 1"):
        ParallelConfig(tp=0)
    with pytest.raises(UserError, match="recompute must be"):
        TrainConfig(recompute="sometimes")
    with pytest.raises(UserError, match=r"micro_batch_tokens must be at least max_context \(4096\).*got 1024"):
        TrainConfig(max_context=4096, micro_batch_tokens=1024)
    # Past int64 numpy overflows deep in sampling; past a million GPUs planning crawls: both refused up front.
    with pytest.raises(UserError, match=r"global_batch_tokens must be a positive integer of at most 2\*\*40"):
        TrainConfig(global_batch_tokens=10**30)
    assert TrainConfig(max_context=2**40, global_batch_tokens=2**40).max_context == 2**40
    with pytest.raises(UserError, match=r"tp\*pp\*dp\*cp = 2147483648 GPUs; at most 2\*\*20"):
        ParallelConfig(cp=2**31)
    assert ParallelConfig(tp=1024, dp=1024).num_devices == 2**20
    with pytest.raises(UserError, match=r"gpus_per_node must be at most 2\*\*20, got 1048577"):
        dataclasses.replace(build_config().cluster, gpus_per_node=2**20 + 1)
    assert TrainConfig(max_context=4096).micro_batch_cap == 4096  # by default a context-length sequence
    assert TrainConfig(max_context=4096, micro_batch_tokens=16384).micro_batch_cap == 16384
    with pytest.raises(UserError, match=r"unknown key\(s\) \['tpp'\]"):
        Config.from_dict({"model": "tiny", "cluster": "h100-sxm", "parallel": {"tpp": 2}})
    with pytest.raises(UserError, match="expected int"):
        Config.from_dict({"model": "tiny", "cluster": "h100-sxm", "parallel": {"tp": "2"}})
    with pytest.raises(UserError, match="version 7 is not supported"):
        Config.from_dict({"version": 7, "model": "tiny", "cluster": "h100-sxm"})


def test_bad_config_file_is_a_user_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("model = [")
    with pytest.raises(UserError, match="not valid TOML"):
        load_config(path)
    with pytest.raises(UserError, match="cannot read config"):
        load_config(tmp_path / "missing.json")


def test_configs_are_frozen():
    config = build_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.parallel.tp = 2  # type: ignore[misc]


def test_layer_ops_names_whose_layers_the_runtime_runs():
    assert TrainConfig().layer_ops == "slimpack"
    with pytest.raises(UserError, match="layer_ops must be 'slimpack' or 'transformers', got 'torch'"):
        TrainConfig(layer_ops="torch")
