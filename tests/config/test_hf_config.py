"""Model shapes from Hugging Face config.json files. The fixtures in hf_configs/ hold the fields of
the published config.json of each checkpoint (same names, same values)."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from slimpack.config import build_config, load_config, model_preset, resolve_model
from slimpack.errors import UserError

CONFIGS = Path(__file__).parent / "hf_configs"


def checkpoint_dir(tmp_path: Path, fixture: str) -> Path:
    """A directory laid out as a downloaded checkpoint: <name>/config.json."""
    directory = tmp_path / Path(fixture).stem
    directory.mkdir()
    shutil.copy(CONFIGS / fixture, directory / "config.json")
    return directory


@pytest.mark.parametrize(("fixture", "preset"), [
    ("Meta-Llama-3-8B.json", "llama3-8b"), ("Meta-Llama-3-70B.json", "llama3-70b"),
    ("Qwen2.5-7B.json", "qwen2.5-7b"), ("Qwen2.5-72B.json", "qwen2.5-72b"),
    ("Llama-3.2-1B.json", "llama3.2-1b"), ("Qwen2.5-1.5B.json", "qwen2.5-1.5b"),  # tied heads
])
def test_published_config_gives_the_matching_preset(tmp_path, fixture, preset):
    model = resolve_model(str(checkpoint_dir(tmp_path, fixture)))
    assert model.name == Path(fixture).stem  # the checkpoint directory names it
    assert dataclasses.replace(model, name=preset) == model_preset(preset)


def test_a_config_file_path_works_as_well_as_its_directory(tmp_path):
    by_dir = resolve_model(str(checkpoint_dir(tmp_path, "Qwen2.5-7B.json")))
    by_file = resolve_model(str(tmp_path / "Qwen2.5-7B" / "config.json"))
    assert by_file == by_dir


def test_qwen3_and_gemma_map_their_fields(tmp_path):
    qwen3 = resolve_model(str(CONFIGS / "Qwen3-8B.json"))
    assert (qwen3.num_layers, qwen3.hidden, qwen3.num_heads, qwen3.num_kv_heads, qwen3.ffn_hidden,
            qwen3.vocab_size, qwen3.tie_embeddings) == (36, 4096, 32, 8, 12288, 151936, False)
    gemma = resolve_model(str(CONFIGS / "gemma-2b.json"))
    # Gemma ties its embeddings by default (the key is absent from the file); GeGLU is a gated MLP.
    assert (gemma.num_layers, gemma.hidden, gemma.num_kv_heads, gemma.head_dim, gemma.ffn_kind,
            gemma.tie_embeddings) == (18, 2048, 1, 256, "swiglu", True)
    # 2.51B parameters, as published for Gemma 2B (embedding counted once: tied)
    assert gemma.num_params() / 1e9 == pytest.approx(2.506, rel=0.001)


def test_a_path_works_wherever_a_preset_name_does(tmp_path):
    directory = checkpoint_dir(tmp_path, "Meta-Llama-3-8B.json")
    assert build_config(model=str(directory)).model.hidden == 4096
    config_file = tmp_path / "run.json"
    config_file.write_text(json.dumps({"model": str(directory), "cluster": "h100-sxm"}))
    assert load_config(config_file).model.vocab_size == 128256


@pytest.mark.parametrize(("fixture", "edit", "message"), [
    ("Mistral-7B-v0.1.json", {}, "sliding-window attention (sliding_window=4096) is not supported"),
    ("Qwen2.5-7B.json", {"use_sliding_window": True}, "sliding-window attention"),
    ("Meta-Llama-3-8B.json", {"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window"),
    ("Mixtral-8x7B-v0.1.json", {}, "mixture-of-experts (num_local_experts=8) is not supported"),
    ("Qwen3-8B.json", {"num_experts": 128, "model_type": "qwen3_moe"}, "mixture-of-experts"),
    ("Qwen3-8B.json", {"hidden_size": 1024, "num_attention_heads": 16},
     "head_dim=128 differs from hidden_size/num_attention_heads = 1024/16"),
    ("Meta-Llama-3-8B.json", {"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ("Meta-Llama-3-8B.json", {"model_type": ["llama"]}, "model_type ['llama'] is not supported"),
    ("Qwen3-8B.json", {"head_dim": {}}, "head_dim must be a positive integer, got {}"),
    ("Meta-Llama-3-8B.json", {"layer_types": 5}, "layer_types must be a list of attention kinds, got 5"),
    ("Meta-Llama-3-8B.json", {"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    ("Meta-Llama-3-8B.json", {"num_hidden_layers": None}, "missing 'num_hidden_layers'"),
    ("Meta-Llama-3-8B.json", {"vocab_size": "big"}, "vocab_size must be a positive integer"),
    ("Meta-Llama-3-8B.json", {"text_config": {}}, "multimodal configs"),
])
def test_unsupported_features_are_refused_in_one_line(tmp_path, fixture, edit, message):
    data = json.loads((CONFIGS / fixture).read_text())
    data.update(edit)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=None) as info:
        resolve_model(str(path))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_slimpack_model_file_is_read_too(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(model_preset("tiny").to_dict()))
    assert resolve_model(str(path)) == model_preset("tiny")


@pytest.mark.parametrize(("content", "message"), [
    (None, "unknown model"),
    ("[1, 2]", "expected a JSON object"),
    ("{not json", "is not valid JSON"),
])
def test_bad_model_arguments_exit_2_with_one_line(tmp_path, cli, capsys, content, message):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    assert cli(["cost", "--tokens", "4096", "--model", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_plans_with_a_checkpoint_directory(tmp_path, cli):
    directory = checkpoint_dir(tmp_path, "Meta-Llama-3-8B.json")
    out = tmp_path / "plan.json"
    assert cli(["plan", "--strategy", "fixed", "--model", str(directory), "--tp", "8", "--pp", "4",
                "--max-context", "32K", "--global-batch-tokens", "256K", "-o", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["config"]["model"]["name"] == "Meta-Llama-3-8B"
    assert saved["config"]["model"]["vocab_size"] == 128256
