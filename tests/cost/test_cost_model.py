import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slimpack.config import (
    EfficiencyConfig,
    ParallelConfig,
    TrainConfig,
    build_config,
    model_preset,
)
from slimpack.config.efficiency import efficiency_preset
from slimpack.cost import CostModel
from slimpack.cost.comm import ring_allreduce_time, ring_gather_time
from slimpack.cost.memory import activation_bytes_per_token
from slimpack.errors import UserError


def _plain_cost(parallel=None, **train):
    # overhead 0, no size penalty, no elementwise term: times reduce to FLOPs / rate
    eff = EfficiencyConfig(gemm_max=0.5, gemm_half_tokens=0, attention_max=0.25, attention_backward_max=0.2,
                           attention_half_tokens=0, elementwise_bandwidth=None, layer_overhead_s=0)
    return CostModel(build_config(model="llama2-7b", parallel=parallel or ParallelConfig(pp=4),
                                  train=TrainConfig(**train), efficiency=eff))


def test_layer_time_is_flops_over_rate_without_size_effects():
    cost = _plain_cost(recompute="none")
    peak = 989.4e12
    linear = 404_750_336 * 8192
    attention = 16384 * 8192 * 8193 / 2
    assert cost.layer_time([8192], [0], backward=False) == pytest.approx(
        linear / (0.5 * peak) + attention / (0.25 * peak), rel=1e-12)
    # backward attention runs at its own efficiency (0.2 here)
    assert cost.layer_time([8192], [0], backward=True) == pytest.approx(
        2 * linear / (0.5 * peak) + 2.5 * attention / (0.2 * peak), rel=1e-12)
    # selective recomputation adds one attention forward (at the forward efficiency) to backward
    assert _plain_cost(recompute="selective").layer_time([8192], [0], backward=True) == pytest.approx(
        2 * linear / (0.5 * peak) + 2.5 * attention / (0.2 * peak) + attention / (0.25 * peak), rel=1e-12)
    # a middle stage runs 8 layers and nothing else
    assert cost.group_time([8192], [0], virtual_stage=1, backward=False) == pytest.approx(
        8 * cost.layer_time([8192], [0], backward=False), rel=1e-12)


def test_elementwise_work_is_charged_per_token_at_hbm_bandwidth():
    eff = EfficiencyConfig(gemm_max=0.5, gemm_half_tokens=0, attention_max=0.25, attention_half_tokens=0,
                           elementwise_bandwidth=0.5, layer_overhead_s=0)
    with_term = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=2), efficiency=eff))
    without = _plain_cost(parallel=ParallelConfig(tp=2))
    # llama2-7b: norms 4h + RoPE 2(h + h_kv) + SwiGLU 3f + residuals 6h = 90368 elements of 2 bytes,
    # sharded over tp = 2, at half of 3.35 TB/s; backward moves twice as much
    per_token = 90368 * 2 / 2 / (0.5 * 3.35e12)
    tp_comm = 1000 * 4096 * 2 * 0.5 / 450e9 + 3e-6  # one ring gather over 2 ranks
    assert with_term.layer_time([1000], [0], backward=False) - without.layer_time([1000], [0], backward=False) \
        == pytest.approx(1000 * per_token, rel=1e-9)
    forward_rest = with_term.layer_time([1000], [0], backward=False) - 1000 * per_token - 4 * tp_comm
    assert with_term.layer_time([1000], [0], backward=True) == pytest.approx(
        2 * 1000 * per_token + 6 * tp_comm + 2 * 404_750_336 * 1000 / 2 / (0.5 * 989.4e12)
        + 2.5 * 16384 * 1000 * 1001 / 2 / 2 / (0.45 * 989.4e12), rel=1e-9)
    assert forward_rest == pytest.approx(404_750_336 * 1000 / 2 / (0.5 * 989.4e12)
                                         + 16384 * 1000 * 1001 / 2 / 2 / (0.25 * 989.4e12), rel=1e-9)


def test_tensor_parallel_collectives_per_pass_follow_sequence_parallelism():
    # with sequence parallelism: 4 gathers/scatters forward, 6 backward (inputs re-gathered for the
    # weight gradients); without it two all-reduces (= 4 gathers) in each pass
    tokens = 4096
    gather = 7 / 8 * tokens * 4096 * 2 / 450e9 + 7 * 3e-6
    for sp, backward_count in ((True, 6), (False, 4)):
        tp8 = _plain_cost(parallel=ParallelConfig(tp=8, sequence_parallel=sp))
        forward_comm = tp8.layer_time([tokens], [0], backward=False) - (
            404_750_336 * tokens / 8 / (0.5 * 989.4e12) + 16384 * tokens * (tokens + 1) / 2 / 8 / (0.25 * 989.4e12))
        assert forward_comm == pytest.approx(4 * gather, rel=1e-9)
        backward_comm = tp8.layer_time([tokens], [0], backward=True) - (
            2 * 404_750_336 * tokens / 8 / (0.5 * 989.4e12)
            + 2.5 * 16384 * tokens * (tokens + 1) / 2 / 8 / (0.2 * 989.4e12))
        assert backward_comm == pytest.approx(backward_count * gather, rel=1e-9)


def test_kernel_family_presets_differ_only_in_attention():
    fa2, fa3 = efficiency_preset("fa2"), efficiency_preset("fa3")
    assert (fa2.attention_max, fa2.attention_backward_max) == (0.35, 0.30)
    assert (fa3.attention_max, fa3.attention_backward_max) == (0.60, 0.45)
    assert fa3 == EfficiencyConfig()  # the default
    assert fa2.gemm_max == fa3.gemm_max and fa2.kernels == "fa2"
    with pytest.raises(UserError, match="unknown kernel family 'fa1'"):
        efficiency_preset("fa1")


def test_whole_document_seconds_hand_computed():
    cost = _plain_cost(parallel=ParallelConfig(tp=2, pp=4))
    peak = 989.4e12
    # one document of 1000 tokens: 32 layers of GEMMs (3x forward) at 0.5 and attention forward at
    # 0.25 + backward (2.5x) at 0.2; the head's GEMM (3x) at 0.5 and 3 fp32 passes over the logits;
    # GPU-seconds, so tensor parallelism does not change it
    pairs = 1000 * 1001 / 2
    layers = 32 * (3 * 404_750_336 * 1000 / (0.5 * peak)
                   + 16384 * pairs / (0.25 * peak) + 2.5 * 16384 * pairs / (0.2 * peak))
    head = 3 * 2 * 4096 * 32000 * 1000 / (0.5 * peak) + 1000 * 32000 * 4 * 3 / 3.35e12
    assert cost.whole_document_seconds([1000]) == pytest.approx(layers + head, rel=1e-12)
    assert cost.whole_document_seconds([1000, 1000]) == pytest.approx(2 * (layers + head), rel=1e-12)
    tp1 = _plain_cost(parallel=ParallelConfig(tp=1, pp=4))
    assert tp1.whole_document_seconds([1000, 37]) == pytest.approx(cost.whole_document_seconds([1000, 37]))


def test_small_slices_run_below_peak():
    cost = CostModel(build_config(model="llama2-7b"))
    per_token_small = cost.layer_time([128], [0], backward=False) / 128
    per_token_large = cost.layer_time([8192], [0], backward=False) / 8192
    assert per_token_small > 1.5 * per_token_large


def test_last_stage_pays_for_the_head_and_first_for_the_embedding():
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(pp=4)))
    middle = cost.group_time([4096], [0], virtual_stage=1, backward=False)
    assert cost.group_time([4096], [0], virtual_stage=3, backward=False) > middle * 1.05
    assert cost.group_time([4096], [0], virtual_stage=0, backward=False) > middle


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 9000), st.integers(0, 60000)), min_size=1, max_size=6),
       st.booleans(), st.sampled_from(["none", "selective", "full"]), st.sampled_from([1, 2, 8]),
       st.sampled_from([1, 2, 4]), st.booleans())
def test_group_time_is_constant_plus_additive_slice_costs(slices, backward, recompute, tp, cp, sequence_parallel):
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(
        pp=4, tp=tp, cp=cp, sequence_parallel=sequence_parallel), train=TrainConfig(recompute=recompute)))
    tokens, prefix = zip(*slices, strict=True)
    exact = cost.group_time(tokens, prefix, virtual_stage=1, backward=backward)
    additive = cost.group_constant(backward=backward) + cost.slice_costs(tokens, prefix, backward=backward).sum()
    assert additive == pytest.approx(exact, rel=1e-9)


def test_context_parallelism_splits_work_and_adds_kv_exchange():
    one = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=8)))
    two = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, cp=2)))
    t1 = one.layer_time([131072], [0], backward=False)
    t2 = two.layer_time([131072], [0], backward=False)
    assert 0.45 * t1 < t2 < 0.6 * t1


def test_activation_bytes_per_token_hand_computed():
    m = model_preset("llama2-7b")  # h = 4096, f = 11008, MHA
    # none: 6h (norm in/out x2, Q, attention out) + 2h (K, V) + 3f, in bf16, + fp32 lse per head
    none = activation_bytes_per_token(m, recompute="none", tp=1, cp=1, sequence_parallel=True)
    assert none == (6 * 4096 + 2 * 4096 + 3 * 11008) * 2 + 32 * 4
    # selective under FlashAttention: the attention output stays (output projection input); only the
    # log-sum-exp (32 heads x 4 bytes) is dropped
    assert activation_bytes_per_token(m, recompute="selective", tp=1, cp=1, sequence_parallel=True) == none - 32 * 4
    # cp 2: every cp rank keeps the all-gathered K and V of all tokens (2h / tp in bf16), half the rest
    kv = 2 * 4096 / 8 * 2
    assert activation_bytes_per_token(m, recompute="selective", tp=8, cp=2, sequence_parallel=True) == \
        pytest.approx(((none - 32 * 4) / 8 - kv) / 2 + kv)
    assert activation_bytes_per_token(m, recompute="full", tp=1, cp=1, sequence_parallel=True) == 4096 * 2
    assert activation_bytes_per_token(m, recompute="full", tp=8, cp=2, sequence_parallel=True) == 4096 * 2 / 16
    sp = activation_bytes_per_token(m, recompute="none", tp=8, cp=2, sequence_parallel=True)
    no_sp = activation_bytes_per_token(m, recompute="none", tp=8, cp=2, sequence_parallel=False)
    assert sp == pytest.approx(((6 * 4096 + 2 * 4096 + 3 * 11008) * 2 + 32 * 4) / 8 / 2 + kv / 2)
    assert no_sp == pytest.approx(((2 * 4096 + 2 * 4096 + 3 * 11008) * 2 / 8 + 4 * 4096 * 2 + 4 * 4) / 2 + kv / 2)


def _peak_1f1b_bytes(cost: CostModel, stage: int, tokens: int) -> float:
    """Stage `stage` of 1F1B holds pp - stage micro-batches, plus one layer's working set."""
    pp = cost.config.parallel.pp
    held = (pp - stage) * cost.activation_bytes(tokens, virtual_stage=stage)
    return cost.model_state_bytes(stage) + held + cost.working_bytes(tokens)


def test_wlb_llm_7b_at_128k_fits_in_80gb_and_naive_layouts_do_not():
    # WLB-LLM (OSDI'25) trains 7B at 128K context with tp 8, cp 2, pp 4.
    fitting = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, cp=2, pp=4, dp=2),
                                     train=TrainConfig(max_context=131072)))
    usable = fitting.config.cluster.usable_memory_bytes
    assert max(_peak_1f1b_bytes(fitting, s, 131072) for s in range(4)) < usable
    for parallel in (ParallelConfig(tp=1, pp=1, dp=64), ParallelConfig(tp=4, pp=1, dp=16),
                     ParallelConfig(tp=2, pp=4, dp=8)):
        naive = CostModel(build_config(model="llama2-7b", parallel=parallel,
                                       train=TrainConfig(max_context=131072, recompute="none")))
        assert max(_peak_1f1b_bytes(naive, s, 131072) for s in range(parallel.pp)) > usable


def test_model_states_follow_zero_accounting():
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, pp=4, dp=4)))
    m = model_preset("llama2-7b")
    stage1 = 8 * m.layer_params() / 2
    assert cost.stage_params(1) == stage1
    assert cost.model_state_bytes(1) == pytest.approx(stage1 * (2 + 2 + 12 / 4))
    assert cost.stage_params(0) == (8 * m.layer_params() + 32000 * 4096) / 2
    assert cost.stage_params(3) == (8 * m.layer_params() + 32000 * 4096 + 4096) / 2


def test_a_sample_floor_never_drops_below_its_whole_k_and_v():
    """tp 2 pp 2, no recomputation: a 200K-token sample's floor on stage 1 (16 layers and the head)
    at cp c is the stage's model states plus its kept activations, of which K and V (2·h/tp bf16
    elements per token and layer) stay whole on every cp rank and the rest (logits included) split
    over c: so no cp, however wide, takes it below the states plus 24.4 GiB of K and V."""
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, pp=2, dp=8),
                                  train=TrainConfig(recompute="none")))
    tokens = 200_000
    kv = tokens * 16 * 2 * 4096 / 2 * 2
    states = max(cost.model_state_bytes(0), cost.model_state_bytes(1))
    assert states == cost.model_state_bytes(1)  # the head's parameters outweigh the embedding's
    per_token = activation_bytes_per_token(model_preset("llama2-7b"), recompute="none", tp=2, cp=1,
                                           sequence_parallel=True)
    rest = tokens * (16 * (per_token - 2 * 4096 / 2 * 2) + 32000 / 2 * 4 + 2 * 4096 * 2 / 2)
    for cp in (1, 8, 64):
        assert cost.sample_floor_bytes(tokens, cp=cp) == pytest.approx(states + kv + rest / cp, rel=1e-12)
    assert kv / 2**30 == pytest.approx(24.41, abs=0.01)
    assert cost.sample_floor_bytes(tokens, cp=math.inf) == pytest.approx(states + kv, rel=1e-12)  # the limit


def test_ring_collectives_closed_form():
    assert ring_gather_time(8e9, 8, 400e9, 1e-6) == pytest.approx(7 / 8 * 8e9 / 400e9 + 7e-6)
    assert ring_allreduce_time(8e9, 8, 400e9, 1e-6) == pytest.approx(2 * (7 / 8 * 8e9 / 400e9 + 7e-6))
    assert ring_gather_time(8e9, 1, 400e9, 1e-6) == 0


def test_p2p_and_grad_sync():
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=4, dp=2)))
    # 4096 tokens of hidden 4096 in bf16, sharded by tp under SP; stages sit in different nodes
    assert cost.p2p_bytes(4096) == 4096 * 4096 * 2 / 8
    assert cost.p2p_time(4096, from_stage=0, to_stage=1) == pytest.approx(4096 * 4096 * 2 / 8 / 50e9 + 10e-6)
    size = cost.stage_params(1) * 2
    assert cost.grad_sync_time(1) == pytest.approx(2 * (0.5 * size / 50e9 + 10e-6))
    assert np.isfinite(cost.optimizer_time(0)) and cost.optimizer_time(0) > 0


def test_a_p2p_hop_is_priced_by_the_ranks_of_its_own_replicas():
    """tp 2, dp 3, pp 2 on 8-GPU nodes (450 / 50 GB/s, 3 / 10 us): a stage holds 6 ranks. Replica 0
    sends ranks 0-1 to 6-7, all on node 0; replica 1 sends 2-3 to 8-9 and replica 2 4-5 to 10-11,
    across nodes 0 and 1. 4096 tokens of hidden 4096 in bf16, sharded by tp 2: 8 MiB per rank."""
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, dp=3, pp=2)))
    size = 4096 * 4096 * 2 / 2
    for replicas, (bw, lat) in (((0,), (450e9, 3e-6)), ((1,), (50e9, 10e-6)), ((2,), (50e9, 10e-6)),
                                ((0, 1), (50e9, 10e-6))):  # a merged pair: its slowest pair of ranks
        for hop in ((0, 1), (1, 0)):  # activations forward, their gradients back
            assert cost.p2p_time(4096, from_stage=hop[0], to_stage=hop[1], replicas=replicas) == pytest.approx(
                size / bw + lat), (replicas, hop)
    # elementwise, as the simulator asks: the same stage (no hop) never crosses
    times = cost.p2p_time(np.array([4096, 4096]), from_stage=np.array([0, 1]), to_stage=np.array([1, 1]),
                          replicas=(2,))
    assert times.tolist() == pytest.approx([size / 50e9 + 10e-6, size / 450e9 + 3e-6])


def test_p2p_hops_agree_over_replicas_where_a_stage_divides_or_fills_nodes():
    """Where dp·cp·tp divides a node's GPUs or is a multiple of them, every replica's hop runs at
    the link replica 0's does (the rule before hops were priced per replica)."""
    for tp, cp, dp, pp in ((1, 1, 2, 4), (2, 2, 2, 4), (8, 1, 2, 4), (4, 2, 4, 2), (1, 1, 16, 8)):
        cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp)))
        first = cost.hops_within_node((0,))
        for r in range(dp):
            assert (cost.hops_within_node((r,)) == first).all(), (tp, cp, dp, pp, r)
        stage_ranks = tp * cp * dp
        for a in range(pp):
            for b in range(pp):
                assert first[a, b] == ((a * stage_ranks) // 8 == (b * stage_ranks) // 8)


def test_a_group_that_straddles_a_node_boundary_pays_the_inter_node_link():
    """tp 4, dp 4 on 8-GPU nodes (450 / 50 GB/s, 3 / 10 us): replica r holds ranks 4r..4r+3, so
    replicas (0, 1) share node 0 and replicas (1, 2), ranks 4..11, straddle nodes 0 and 1."""
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=4, dp=4)))
    assert not cost.cp_crosses_nodes((0, 1), stage=0) and cost.cp_crosses_nodes((1, 2), stage=0)
    assert cost.cp_crosses_nodes((0, 1, 2, 3), stage=0)
    tokens = 8192
    times = {cross: cost.cells_time(np.array([float(tokens)]), np.array([0.0]), virtual_stage=0, backward=False,
                                    cp=2, cross_node=cross)[0] for cross in (None, False, True)}
    assert times[None] == times[False]  # 8 ranks, aligned: the layout's own rule says one node
    kv = tokens * 4096 / 4 * 2  # K (or V) columns of this tp rank, all rows, bf16: gathered over 2 ranks
    per_layer = 2 * ((kv / 2 / 50e9 + 10e-6) - (kv / 2 / 450e9 + 3e-6))  # K and V, one ring step each
    assert times[True] - times[False] == pytest.approx(32 * per_layer, rel=1e-9)


def test_a_stage_whose_gradient_group_straddles_a_node_boundary_syncs_at_the_inter_node_link():
    """tp 2, dp 3, pp 2: stage 0 holds ranks 0..5 (node 0), stage 1 ranks 6..11 (nodes 0 and 1)."""
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, dp=3, pp=2)))
    size = [cost.stage_params(stage) * 2 for stage in (0, 1)]  # bf16 gradients
    assert cost.grad_sync_time(0) == pytest.approx(2 * (2 / 3 * size[0] / 450e9 + 2 * 3e-6))
    assert cost.grad_sync_time(1) == pytest.approx(2 * (2 / 3 * size[1] / 50e9 + 2 * 10e-6))


def test_layer_collectives_hand_computed():
    """llama2-7b (h 4096, MHA: kv_hidden 4096, bf16), tp 8, cp 2, a 4096-token group."""
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, cp=2)))
    forward = cost.layer_collectives(4096, backward=False)
    backward = cost.layer_collectives(4096, backward=True)
    layer_input = 4096 / 2 * 4096 * 2  # this cp rank's 2048 rows of the hidden size
    kv = 4096 * 4096 / 8 * 2  # all 4096 rows of this tp rank's K (or V) columns
    assert [(c.kind, c.group, c.ranks, c.size_bytes) for c in forward] == \
        [("all_gather", "tp", 8, layer_input), ("reduce_scatter", "tp", 8, layer_input)] * 2 + \
        [("all_gather", "cp", 2, kv)] * 2
    assert [(c.kind, c.group) for c in backward] == \
        [("all_gather", "tp"), ("all_gather", "tp"), ("reduce_scatter", "tp")] * 2 + [("reduce_scatter", "cp")] * 2
    assert forward[-1].sent_bytes() == kv / 2  # each cp rank sends its half of the rows once


_SEGMENT = st.tuples(st.integers(1, 9000), st.integers(0, 200_000))  # (tokens, prefix)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_SEGMENT, min_size=1, max_size=40), min_size=1, max_size=12), st.sampled_from([1, 2, 4]))
def test_groups_sums_are_each_groups_sums_bit_for_bit(groups, cp):
    # groups of up to 40 segments: past numpy's 8-element blocks, where a different summation
    # order would show in the last bits
    cost = CostModel(build_config(model="llama2-7b", parallel=ParallelConfig(tp=2, pp=2, cp=cp)))
    tokens = np.array([t for group in groups for t, _ in group], dtype=np.int64)
    prefix = np.array([p for group in groups for _, p in group], dtype=np.int64)
    firsts = np.cumsum([0] + [len(group) for group in groups[:-1]])
    totals, attention = cost.groups_sums(tokens, prefix, firsts, cp)
    for i, group in enumerate(groups):
        assert (totals[i], attention[i]) == cost.group_sums([t for t, _ in group], [p for _, p in group], cp)


def test_a_tied_head_on_a_later_stage_is_a_copy_of_the_embedding():
    """Llama-3-8B with its embedding tied (V 128256 x h 4096): on one stage the head is the embedding
    (counted once); over a pipeline the last stage holds a copy, whose gradient the first and last
    stages sum as pairs after their own all-reduce: tp 2 pp 2 dp 2, a stage holds 4 ranks, so rank r
    of stage 0 and its counterpart r + 4 share node 0 (450 GB/s, 3 us): size / bw + 2 lat."""
    tied = dataclasses.replace(model_preset("llama3-8b"), tie_embeddings=True)
    layer, embedding, hidden = tied.layer_params(), tied.embedding_params(), tied.hidden
    one_stage = CostModel(build_config(model=tied, parallel=ParallelConfig(tp=2, dp=2)))
    assert one_stage.stage_params(0) == (32 * layer + embedding + hidden) / 2
    assert one_stage.tied_embedding_sync_time() == 0.0
    two = CostModel(build_config(model=tied, parallel=ParallelConfig(tp=2, pp=2, dp=2)))
    assert two.stage_params(0) == (16 * layer + embedding) / 2
    assert two.stage_params(1) == (16 * layer + embedding + hidden) / 2  # the untied model's last stage
    untied = CostModel(build_config(model="llama3-8b", parallel=ParallelConfig(tp=2, pp=2, dp=2)))
    assert two.stage_params(1) == untied.stage_params(1)
    shard = embedding / 2 * 2  # bf16 gradients of the rank's vocabulary half
    assert two.tied_embedding_sync_time() == pytest.approx(shard / 450e9 + 2 * 3e-6)
    for stage in (0, 1):
        own = ring_allreduce_time(two.stage_params(stage) * 2, 2, 450e9, 3e-6)
        assert two.grad_sync_time(stage) == pytest.approx(own + shard / 450e9 + 2 * 3e-6)
    # four stages of 4 ranks: stage 0 (ranks 0-3) and stage 3 (12-15) lie on two nodes; the middle
    # stages sum no embedding
    four = CostModel(build_config(model=tied, parallel=ParallelConfig(tp=2, pp=4, dp=2)))
    assert four.tied_embedding_sync_time() == pytest.approx(shard / 50e9 + 2 * 10e-6)
    middle = CostModel(build_config(model="llama3-8b", parallel=ParallelConfig(tp=2, pp=4, dp=2)))
    assert four.grad_sync_time(1) == middle.grad_sync_time(1)
