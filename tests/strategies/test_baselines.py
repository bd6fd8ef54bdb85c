"""Each baseline's behaviour on small hand-made inputs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import synthetic_batch
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.cost import model_training_flops
from slimpack.plan.check import check_plan
from slimpack.plan.types import Sample, Slice
from slimpack.sim import simulate
from slimpack.strategies import STRATEGIES, make_planner
from slimpack.strategies.bfd import BFDPlanner
from slimpack.strategies.bytescale import ByteScalePlanner
from slimpack.strategies.fixed import FixedPlanner, pack_fixed_length
from slimpack.strategies.kk import KKPlanner
from slimpack.strategies.micro_batches import memory_token_cap
from slimpack.strategies.slimpipe import SlimPipePlanner, slice_sequence
from slimpack.strategies.wlb import WLBPlanner, sequence_shards


def cfg(context, dp=2, cp=1, **train):
    return build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=4, dp=dp, cp=cp),
                        train=TrainConfig(max_context=context, **train))


def batch(lengths, step=0, first_id=0):
    return [Sample(id=first_id + i, length=n, arrival_step=step) for i, n in enumerate(lengths)]


def group_ids(plan):
    return [[[s.sample_id for s in g] for g in pipe.forward] for pipe in plan.pipelines]


def test_registry_names():
    assert set(STRATEGIES) >= {"fixed", "bfd", "kk", "wlb", "slimpipe", "bytescale"}
    assert make_planner("bfd", cfg(1024)).name == "bfd"


def test_bfd_bins_and_replicas():
    # bins of [5,7,3,2,4,6,1] at capacity 10: [7,3] [6,4] [5,2,1] (see test_packing); by tokens
    # 10, 10, 8: LPT puts bin 0 on replica 0, bin 1 on replica 1, bin 2 on replica 0 (tie: lower index)
    plan = BFDPlanner(cfg(10)).plan(batch([5, 7, 3, 2, 4, 6, 1]), step=0)
    check_plan(plan)
    assert group_ids(plan) == [[[1, 2], [0, 3, 6]], [[5, 4]]]


def test_bfd_cuts_documents_longer_than_the_context():
    plan = BFDPlanner(cfg(10, dp=1)).plan(batch([25, 3]), step=0)
    check_plan(plan)
    assert sorted(s.length for s in plan.samples) == [3, 5, 10, 10]
    assert max(s.id for s in plan.samples) == 3  # fresh ids above the batch's


def test_kk_takes_the_smallest_count_that_fits_the_cap():
    # three 6-token samples, cap 10: ceil(18/10) = 2 micro-batches would need a 12-token one
    plan = KKPlanner(cfg(10, dp=1)).plan(batch([6, 6, 6]), step=0)
    check_plan(plan)
    assert plan.info["micro_batches_per_replica"] == [3]
    assert all(len(g) == 1 for g in plan.pipelines[0].forward)


def test_kk_balances_replicas_with_equal_counts_and_same_micro_batch_count():
    plan = KKPlanner(cfg(10)).plan(batch([6, 6, 5, 5, 4, 4, 3, 3]), step=0)
    check_plan(plan)
    lengths = plan.sample_lengths()
    per_replica = [[s for g in p.forward for s in g] for p in plan.pipelines]
    assert [len(r) for r in per_replica] == [4, 4]
    assert [sum(lengths[s.sample_id] for s in r) for r in per_replica] == [18, 18]
    assert [len(p.forward) for p in plan.pipelines] == [2, 2]
    assert all(sum(s.tokens for s in g) <= 10 for p in plan.pipelines for g in p.forward)


def test_kk_orders_micro_batches_light_at_both_ends():
    config = cfg(32768, dp=1)
    plan = KKPlanner(config).plan(synthetic_batch(3, 12 * 32768, 32768), step=0)
    check_plan(plan)
    load = [sum(model_training_flops(config.model, s.tokens) for s in g) for g in plan.pipelines[0].forward]
    peak = load.index(max(load))
    assert 0 < peak < len(load) - 1
    assert load[:peak + 1] == sorted(load[:peak + 1])
    assert load[peak:] == sorted(load[peak:], reverse=True)


def test_wlb_queue_releases_one_outlier_per_micro_batch_and_gives_them_back():
    planner = WLBPlanner(cfg(1000, dp=1), s_max=2000, outlier_lengths=[800])
    # step 0: 2900 tokens -> 3 micro-batches; the 900-token outlier waits (queue holds 1 < 3)
    plan0 = planner.plan(batch([500, 500, 500, 500, 900]), step=0)
    check_plan(plan0)
    assert plan0.deferred == (4,)
    assert 4 in plan0.sample_lengths()
    # step 1: two more outliers: the queue holds 3 = the number of micro-batches and releases them
    plan1 = planner.plan(batch([900, 900, 500, 500], step=1, first_id=5), step=1)
    check_plan(plan1)
    assert plan1.deferred == ()
    assert next(s for s in plan1.samples if s.id == 4).arrival_step == 0
    outliers = {4, 5, 6}
    assert sorted(len(outliers & set(ids)) for ids in group_ids(plan1)[0]) == [1, 1, 1]
    assert plan1.info["max_delay_steps"] == 1


def test_wlb_defers_what_does_not_fit_and_drains_on_an_empty_batch():
    planner = WLBPlanner(cfg(1000, dp=1), s_max=1000, outlier_lengths=[950], tokens_per_micro_batch=2000)
    # 2860 new tokens -> 2 micro-batches of at most 1000 tokens: 700 and 600 take them, the second
    # 600 fits neither and waits, as does the 960-token outlier (queue holds 1 < 2)
    plan0 = planner.plan(batch([700, 600, 600, 960]), step=0)
    check_plan(plan0)
    assert sorted(plan0.deferred) == [2, 3]
    # the stream has ended: the queue opens; 1560 tokens make one micro-batch, which takes the
    # outlier (longest first), and the 600 waits one more step
    plan1 = planner.plan([], step=1)
    check_plan(plan1)
    assert sorted(s.id for s in plan1.samples) == [2, 3]
    assert plan1.deferred == (2,)
    plan2 = planner.plan([], step=2)
    assert [s.id for s in plan2.samples] == [2] and plan2.deferred == ()


def test_wlb_default_thresholds_come_from_the_cost_model():
    planner = WLBPlanner(cfg(131072))
    first, second = planner.outlier_lengths
    assert 0 < first < second <= 131072
    reference = 131072 / 1024 * planner.latency([1024])[0]
    # the first level is the shortest aligned length that alone costs a micro-batch of short documents
    assert planner.latency([first])[0] >= reference > planner.latency([first - 128])[0]
    assert planner.latency([second])[0] >= 2 * reference > planner.latency([second - 128])[0]


def test_memory_token_cap_matches_the_simulator():
    config = cfg(4096)
    cap = memory_token_cap(WLBPlanner(config).cost)
    for length, oom in ((cap // 128 * 128, False), (int(cap * 1.05), True)):
        fitting = cfg(length)
        plan = FixedPlanner(fitting).plan(batch([length] * 16), step=0)
        assert simulate(plan).oom is oom


def test_sequence_shards_by_hand():
    # a packed sequence [6 | 2] over cp=2: 4 chunks of 2 tokens; rank 0 holds chunks 0 and 3,
    # rank 1 chunks 1 and 2 (Megatron's causal load balancing)
    assert sequence_shards([6, 2], 2) == [([2, 2], [0, 0]), ([2, 2], [2, 4])]


def test_wlb_picks_cp_sharding_per_micro_batch():
    planner = WLBPlanner(cfg(131072, cp=2))
    # many short documents: per-sequence keeps them whole (better kernels) and is balanced anyway
    assert planner._cp_choice(tuple(Slice(i, 0, 512) for i in range(200))) == "sequence"
    # one long and one shorter document: per-sequence sharding is unbalanced
    assert planner._cp_choice((Slice(0, 0, 100_000), Slice(1, 0, 30_000))) == "document"
    plan = planner.plan(synthetic_batch(1, 8 * 131072, 131072), step=0)
    check_plan(plan)
    assert [len(g) for g in plan.info["cp_sharding"]] == [len(p.forward) for p in plan.pipelines]


def test_slice_sequence_by_hand():
    sequence = [Slice(0, 0, 300), Slice(1, 0, 200)]
    # 500 tokens in 2: the cut at 250 rounds to the 128-token tile at 256
    assert slice_sequence(sequence, 2, 128) == [(Slice(0, 0, 256),), (Slice(0, 256, 300), Slice(1, 0, 200))]
    assert slice_sequence(sequence, 1, 128) == [tuple(sequence)]


def test_slice_sequence_balances_cost_by_hand():
    def pairs(tokens, prefix):  # attention-only cost: causal (query, key) pairs
        return tokens * prefix + tokens * (tokens + 1) / 2

    # one 4096-token document in 2: half of 4096·4097/2 pairs is reached at x ≈ 2896.6; of the tiles
    # around it 2944 (4,335,040 pairs, 139,712 past half) is nearer than 2816 (229,000 short of it)
    assert slice_sequence([Slice(0, 0, 4096)], 2, 128, pairs) == [(Slice(0, 0, 2944),), (Slice(0, 2944, 4096),)]
    # a piece keeps its prefix: [1024, 2048) of a document costs 1024·1024 + 1024·1025/2 = 1,573,376
    # pairs; with a 1024-token document after it (524,800) the half (1,049,088) is 719.6 tokens in
    # (x·1024 + x(x+1)/2 at x = 640: 860,480; at 768: 1,081,728, the nearer tile)
    halves = slice_sequence([Slice(7, 1024, 2048), Slice(8, 0, 1024)], 2, 128, pairs)
    assert halves == [(Slice(7, 1024, 1792),), (Slice(7, 1792, 2048), Slice(8, 0, 1024))]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 700)), min_size=1, max_size=12),
       st.sampled_from([1, 2, 3, 4, 8, 32]), st.sampled_from([1, 16, 128]))
def test_slice_sequence_cuts_the_sequence_in_order(pieces, n, align):
    """Whatever the cuts, the chunks' pieces read back the sequence in order, each within its chunk,
    and a document between a chunk's two ends is its own slice, unchanged."""
    sequence = [Slice(i, start, start + tokens) for i, (start, tokens) in enumerate(pieces)]
    chunks = slice_sequence(sequence, n, align, lambda tokens, prefix: tokens * (prefix + tokens))
    read = [piece for chunk in chunks for piece in chunk]
    assert all(piece.start < piece.end for piece in read) and len(chunks) <= n
    # consecutive pieces of one document join up; the joined pieces are the sequence
    joined = [read[0]]
    for piece in read[1:]:
        last = joined[-1]
        joined[-1:] = [Slice(last.sample_id, last.start, piece.end)] if piece.sample_id == last.sample_id else [last, piece]
    assert joined == sequence
    for chunk in chunks:
        assert all(piece in sequence for piece in chunk[1:-1])


def test_slimpipe_structure_and_choice_of_n():
    config = cfg(131072)
    planner = SlimPipePlanner(config)
    docs = batch([1024] * 8 * 128)  # 8 sequences of short documents: slicing pays off
    plan = planner.plan(docs, step=0)
    check_plan(plan)
    n = plan.info["num_slices"]
    times = plan.info["candidates_step_time_s"]
    assert n > 1 and times[n] == min(times.values())
    pipe = plan.pipelines[0]
    assert len(pipe.forward) == 4 * n
    # backward: each sequence's slices in reverse order
    assert pipe.backward[:n] == tuple(reversed(pipe.forward[:n]))
    samples, sequences = pack_fixed_length(docs, 131072)
    assert simulate(planner.build(samples, sequences, 1, 0)).step_time_s == pytest.approx(times[1])
    fixed = simulate(FixedPlanner(config).plan(docs, step=0))
    assert simulate(plan).step_time_s < fixed.step_time_s


def test_bytescale_buckets_by_length_and_gives_long_replicas_fewer_micro_batches():
    config = cfg(131072)
    plan = ByteScalePlanner(config).plan(synthetic_batch(5, 32 * 131072, 131072), step=0)
    check_plan(plan)
    lengths = plan.sample_lengths()
    replica = [[lengths[s.sample_id] for g in p.forward for s in g] for p in plan.pipelines]
    assert min(replica[0]) >= max(replica[1])
    counts = plan.info["micro_batches_per_replica"]
    assert counts[0] < counts[1]
    flops = [sum(model_training_flops(config.model, n) for n in r) for r in replica]
    assert abs(flops[0] - flops[1]) / sum(flops) < 0.05
    assert all(sum(s.tokens for s in g) <= 131072 for p in plan.pipelines for g in p.forward)


def test_slimpipe_refuses_interleaving():
    config = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=4, virtual_stages=2))
    with pytest.raises(ValueError, match="without interleaved stages; got 2 virtual stages"):
        SlimPipePlanner(config)


def test_a_micro_batch_token_cap_above_the_context_packs_fuller_micro_batches():
    # bfd at capacity 20, longest first 7(1) 6(5) 5(0) 4(4) 3(2) 2(3) 1(6): 7, 6 and 5 fill bin A to
    # 18; 4 opens B; 3 goes to B (A has 2 left); 2 fills A to 20; 1 joins B
    plan = BFDPlanner(cfg(10, dp=1, micro_batch_tokens=20)).plan(batch([5, 7, 3, 2, 4, 6, 1]), step=0)
    check_plan(plan)
    assert group_ids(plan) == [[[1, 5, 0, 3], [4, 2, 6]]]
    assert plan.info["fill"] == 28 / 40
    # documents are still cut at the context, not at the cap: 25 -> 10 + 10 + 5
    plan = BFDPlanner(cfg(10, dp=1, micro_batch_tokens=20)).plan(batch([25, 3]), step=0)
    assert sorted(s.length for s in plan.samples) == [3, 5, 10, 10]
    assert [sum(s.tokens for s in g) for g in plan.pipelines[0].forward] == [20, 8]
    # kk: 18 tokens under a cap of 20 take one micro-batch (three at the context's cap of 10)
    plan = KKPlanner(cfg(10, dp=1, micro_batch_tokens=20)).plan(batch([6, 6, 6]), step=0)
    check_plan(plan)
    assert group_ids(plan) == [[[0, 1, 2]]]
    # fixed: 28 tokens make sequences of 10, 10 and 8; two consecutive sequences per micro-batch
    # (Megatron's micro-batch size: 25 // 10), dealt round-robin over the two replicas
    plan = FixedPlanner(cfg(10, dp=2, micro_batch_tokens=25)).plan(batch([5, 7, 3, 2, 4, 6, 1]), step=0)
    check_plan(plan)
    assert [[sum(s.tokens for s in g) for g in p.forward] for p in plan.pipelines] == [[20], [8]]
    # bytescale: every micro-batch within the cap, fewer of them than at the context's cap
    config = cfg(32768, micro_batch_tokens=4 * 32768)
    docs = synthetic_batch(5, 32 * 32768, 32768)
    capped = ByteScalePlanner(config).plan(docs, step=0)
    check_plan(capped)
    assert all(sum(s.tokens for s in g) <= 4 * 32768 for p in capped.pipelines for g in p.forward)
    assert (sum(capped.info["micro_batches_per_replica"])
            < sum(ByteScalePlanner(cfg(32768)).plan(docs, step=0).info["micro_batches_per_replica"]))
    # wlb counts its micro-batches by the cap
    assert WLBPlanner(config).tokens_per_micro_batch == 4 * 32768
