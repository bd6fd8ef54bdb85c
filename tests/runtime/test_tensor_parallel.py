"""Tensor parallelism (torch DTensor, 2 gloo ranks, float64): per-rank shards of whole heads, and the
loss and every gradient equal to the single-process unsliced reference."""

from __future__ import annotations

import dataclasses

import pytest
from dist_workers import gradient_layouts, tensor_parallel_stages

from slimpack.config import model_preset
from slimpack.plan.types import PipelinePlan, Slice
from slimpack.runtime.launch import spawn
from slimpack.runtime.tensor_parallel import check_tensor_parallel

TINY = model_preset("tiny")


def _asymmetric_pipeline() -> tuple[PipelinePlan, dict[int, int]]:
    """Sample 0 in three slices (K/V prefixes), forward and backward grouped differently; odd token
    counts, so sequence parallelism splits rows unevenly over the tp ranks."""
    s = [Slice(0, 0, 41), Slice(0, 41, 70), Slice(0, 70, 101), Slice(1, 0, 31), Slice(2, 0, 50)]
    forward = ((s[0],), (s[1], s[3]), (s[2], s[4]))
    backward = ((s[4],), (s[2], s[1]), (s[3], s[0]))
    return PipelinePlan(replicas=(0,), cp=1, forward=forward, backward=backward), {0: 101, 1: 31, 2: 50}


@pytest.mark.distributed
def test_tp2_matches_the_unsliced_reference():
    """Both LM-head variants: vocabulary-parallel loss and gathered logits."""
    pipe, lengths = _asymmetric_pipeline()
    results = spawn(tensor_parallel_stages, 2, (pipe, lengths), timeout_s=120)
    h, kv, f = TINY.hidden, TINY.kv_hidden, TINY.ffn_hidden
    for r in results:
        assert r["heads"] == (TINY.num_heads // 2, TINY.num_kv_heads // 2)
        shards = r["shards"]
        assert shards["layers.0.wq.weight"] == (h // 2, h) and shards["layers.0.wk.weight"] == (kv // 2, h)
        assert shards["layers.0.wo.weight"] == (h, h // 2) and shards["layers.0.w_down.weight"] == (h, f // 2)
        assert shards["embedding.weight"] == (TINY.vocab_size // 2, h)
        assert shards["layers.0.attn_norm.weight"] == (h,)  # replicated
        for vocab_parallel in (True, False):
            assert abs(r[vocab_parallel]["loss"] - r["ref_loss"]) <= 1e-12 * r["ref_loss"]
            assert max(r[vocab_parallel]["errors"].values()) < 1e-10, (vocab_parallel, r[vocab_parallel]["errors"])


def test_tp_must_split_whole_heads():
    with pytest.raises(ValueError, match=r"tp=3 does not divide the model's attention heads"):
        check_tensor_parallel(TINY, 3)
    check_tensor_parallel(dataclasses.replace(TINY, tie_embeddings=True), 2)  # a tied head reads the split embedding


@pytest.mark.parametrize(("layer_ops", "sequence_parallel", "refused"), [
    ("slimpack", True, None), ("slimpack", False, "sequence_parallel false"),
    ("transformers", False, None), ("transformers", True, "sequence_parallel true"),
])
def test_the_layout_must_say_whether_the_runtime_runs_sequence_parallelism(layer_ops, sequence_parallel, refused):
    """slimpack's layers always run sequence parallelism under tp, transformers' never do: a layout
    that says otherwise would be costed for another run."""
    from slimpack.config import ParallelConfig, TrainConfig, build_config
    from slimpack.runtime.tensor_parallel import check_sequence_parallel

    config = build_config(model="tiny", parallel=ParallelConfig(tp=2, sequence_parallel=sequence_parallel),
                          train=TrainConfig(layer_ops=layer_ops))
    if refused is None:
        check_sequence_parallel(config)
    else:
        with pytest.raises(ValueError, match=f"tp=2 with {refused}"):
            check_sequence_parallel(config)
    check_sequence_parallel(build_config(model="tiny", train=TrainConfig(layer_ops=layer_ops)))  # tp 1: either


def test_a_split_parameter_keeps_its_share_of_a_replicated_gradient_without_communication():
    """The vocabulary-split embedding's backward hands every rank the whole table's gradient: it is
    cut to the rank's rows locally; a partial gradient (a sequence-parallel norm's gain) is left for
    the one reduction per step (``reduce_partial_gradients``), not reduced at every backward."""
    results = spawn(gradient_layouts, 2, (), timeout_s=60)
    for rank, r in enumerate(results):
        assert r["cut"] == "(Shard(dim=0),)" and r["kept_same"] and r["collectives"] == 0
        assert r["cut_local"] == [[40.0 * rank + 20 * i, 40.0 * rank + 20 * i + 10] for i in range(2)]
