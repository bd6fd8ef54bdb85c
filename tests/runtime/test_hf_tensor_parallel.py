"""Tensor parallelism of transformers' models (``hf_tensor_parallel``, 2 gloo ranks, float64): whole
heads per rank, and the loss and every gradient of a sliced asymmetric plan equal to the model's own
unpacked run in one process. Tiny configs written here, nothing downloaded."""

from __future__ import annotations

import json

import pytest
from dist_workers import hf_collectives_of_one_layer, hf_gradient_check

from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost.model import TP_COLLECTIVES
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice
from slimpack.runtime.launch import spawn
from slimpack.runtime.verify import TRANSFORMERS_FLOAT64_TOLERANCE

pytest.importorskip("transformers")

HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 48, 4, 2, 8, 64
COMMON = {"hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": 2, "num_attention_heads": HEADS,
          "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "tie_word_embeddings": False,
          "initializer_range": 0.2}
CONFIGS = {
    # biases everywhere (column-wise ones split with their heads, row-wise ones replicated); the
    # embedding's padding row (no gradient) lies in rank 1's half of the vocabulary
    "llama": {"model_type": "llama", "attention_bias": True, "mlp_bias": True, "pad_token_id": 40, **COMMON},
    "qwen3": {"model_type": "qwen3", "head_dim": HEAD_DIM, **COMMON},  # per-head q/k norms, replicated
}


def _sliced_plan(model: str, cp: int = 1) -> Plan:
    """Sample 0 in three slices (K/V prefixes), forward and backward grouped differently; tp 2."""
    s = [Slice(0, 0, 40), Slice(0, 40, 70), Slice(0, 70, 100), Slice(1, 0, 30), Slice(2, 0, 50)]
    pipe = PipelinePlan(replicas=(0,), cp=cp, forward=((s[0],), (s[1], s[3]), (s[2], s[4])),
                        backward=((s[4],), (s[2], s[1]), (s[3], s[0])))
    cfg = build_config(model=model, parallel=ParallelConfig(tp=2, cp=cp, pp=1), train=TrainConfig(max_context=256))
    return Plan(config=cfg, strategy="hand", samples=tuple(Sample(id=i, length=n) for i, n in enumerate((100, 30, 50))),
                pipelines=(pipe,))


@pytest.mark.distributed
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_tp2_matches_the_unpacked_run(tmp_path, kind):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS[kind]))
    plan = _sliced_plan(str(path))
    assert not plan.pipelines[0].symmetric
    results = spawn(hf_gradient_check, 2, (plan, str(path), 0), timeout_s=120)
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for r in results:
        shards = r["shards"]
        layer = "hf.model.layers.0."
        assert shards[layer + "self_attn.q_proj.weight"] == (q // 2, HIDDEN)  # 2 of 4 query heads
        assert shards[layer + "self_attn.k_proj.weight"] == (kv // 2, HIDDEN)  # 1 of 2 KV heads
        assert shards[layer + "self_attn.o_proj.weight"] == (HIDDEN, q // 2)
        assert shards[layer + "mlp.up_proj.weight"] == (FFN // 2, HIDDEN)
        assert shards[layer + "mlp.down_proj.weight"] == (HIDDEN, FFN // 2)
        assert shards[layer + "input_layernorm.weight"] == (HIDDEN,)  # replicated
        assert shards["hf.model.embed_tokens.weight"] == (VOCAB // 2, HIDDEN)
        assert shards["hf.lm_head.weight"] == (VOCAB // 2, HIDDEN)
        assert abs(r["loss"] - r["ref_loss"]) <= TRANSFORMERS_FLOAT64_TOLERANCE * abs(r["ref_loss"])
        assert max(r["errors"].values()) < TRANSFORMERS_FLOAT64_TOLERANCE, r["errors"]


@pytest.mark.distributed
@pytest.mark.slow
def test_tp2_by_cp2_on_four_ranks(tmp_path):
    """Qwen3 over tp 2 x cp 2: each cp rank's zigzag share of every slice, its K/V all-gather over cp
    carrying the rank's one KV head; loss and gradients equal to the unpacked run."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIGS["qwen3"]))
    results = spawn(hf_gradient_check, 4, (_sliced_plan(str(path), cp=2), str(path), 0), timeout_s=300)
    assert sorted(r["position"] for r in results) == [(0, 0, c, t) for c in (0, 1) for t in (0, 1)]
    for r in results:
        assert abs(r["loss"] - r["ref_loss"]) <= TRANSFORMERS_FLOAT64_TOLERANCE * abs(r["ref_loss"])
        assert max(r["errors"].values()) < TRANSFORMERS_FLOAT64_TOLERANCE, r["errors"]


@pytest.mark.distributed
def test_collectives_of_one_layer(tmp_path):
    """Plain tensor parallelism (no sequence parallelism): 2 all-reduces of the (T, E) activation
    forward and 2 backward, the cost model's collectives for a layout without sequence parallelism
    (``TP_COLLECTIVES[False]``); Qwen3 adds the all-reduce of its q and k
    norm gains' gradients (head_dim elements each) in backward."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIGS["qwen3"], "num_hidden_layers": 3}))
    tokens = 12
    activation = ("all_reduce", tokens * HIDDEN)
    for r in spawn(hf_collectives_of_one_layer, 2, (str(path), tokens), timeout_s=120):
        assert r["forward"] == [activation, activation]
        # the cost model's list for a layout without sequence parallelism, pass by pass
        assert [kind for kind, _ in r["forward"]] == list(TP_COLLECTIVES[False][0])
        assert [kind for kind, n in r["backward"] if n != HEAD_DIM] == list(TP_COLLECTIVES[False][1])
        assert sorted(r["backward"]) == sorted([activation, activation] + [("all_reduce", HEAD_DIM)] * 2)


def test_train_refuses_kv_heads_that_tp_does_not_split(tmp_path, capsys, cli):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIGS["llama"], "vocab_size": 256}))
    assert cli(["train", "--model", str(path), "--tp", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith("has 2 KV heads, not divisible by tp=4 (each tensor-parallel rank "
                                            "needs whole KV heads)")
