"""The candidate check builds a whole-document candidate's pipelines one at a time and stops as soon as
those built rule it out: exact only if the pipelines are the plan's and a plan is never faster than
any of its pipelines alone."""

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slimpack.strategies.slimpack.candidates as candidate_rules
from helpers import config, synthetic_batch
from slimpack.config import ParallelConfig, PlannerConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.data import load_dataset
from slimpack.plan import Sample
from slimpack.plan.types import group_tokens
from slimpack.sim import pipelines_step_time, simulate
from slimpack.strategies import make_planner
from slimpack.strategies.fixed import pack_fixed_length
from slimpack.strategies.slimpack.candidates import (
    BASELINE_CANDIDATES,
    EQUAL_TOKENS,
    Candidate,
    fastest_fitting,
    plan_fits,
    safest_plan,
    sliced_sequence_plans,
)
from slimpack.strategies.stream import stream_batches


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 1000), pp=st.sampled_from([2, 4]), dp=st.sampled_from([2, 3]))
def test_lazy_pipelines_make_the_plan_and_bound_its_step(seed, pp, dp):
    cfg = config(pp=pp, dp=dp, max_context=32768)
    cost = CostModel(cfg)
    candidates = sliced_sequence_plans(synthetic_batch(seed, 400_000 * dp, 32768), 0, cfg)
    assert candidates
    for candidate in candidates:
        built = dict(candidate.pipelines())
        plan = candidate.assemble([built[p] for p in sorted(built)])
        assert sorted(built) == list(range(dp)) and [pipe.replicas for pipe in plan.pipelines] == [(r,) for r in range(dp)]
        full = simulate(plan, cost).step_time_s
        assert pipelines_step_time(cfg, built.items(), cost) == full
        for index, pipe in built.items():  # one pipeline alone never ends later than the plan
            assert pipelines_step_time(cfg, [(index, pipe)], cost) <= full


def test_the_fastest_fitting_candidate_wins_only_if_strictly_faster_than_the_bar():
    cfg = config(pp=4, dp=2, max_context=32768)
    cost = CostModel(cfg)
    candidates = sliced_sequence_plans(synthetic_batch(3, 800_000, 32768), 0, cfg)
    plans = [c.assemble([pipe for _, pipe in sorted(c.pipelines())]) for c in candidates]
    times = [simulate(p, cost).step_time_s for p in plans]
    fitting = [i for i, p in enumerate(plans) if plan_fits(p, cost)]
    assert fitting
    fastest = min(fitting, key=lambda i: (times[i], i))
    for given_as in (candidates, [Candidate.of(p) for p in plans]):
        found = fastest_fitting(given_as, cost)
        assert found is not None and found[0] == plans[fastest] and found[1] == times[fastest]
        assert fastest_fitting(given_as, cost, beat=times[fastest]) is None
        beaten = fastest_fitting(given_as, cost, beat=times[fastest] * 1.000001)
        assert beaten is not None and beaten[0] == plans[fastest]


def test_sliced_sequences_are_spread_over_replicas_by_flops_not_dealt_in_turn():
    # four sequences of one document each, heaviest first: dealing them in turn gives replica 0 the
    # heavier of both pairs (32768 + 28000 tokens); by FLOPs the heaviest pairs with the lightest
    cfg = config(pp=2, dp=2, max_context=32768)
    lengths = [32768, 30000, 28000, 26000]
    batch = [Sample(id=i, length=n) for i, n in enumerate(lengths)]
    candidate = sliced_sequence_plans(batch, 0, cfg)[0]
    held = {r: sorted(lengths[s.sample_id] for g in pipe.forward for s in g if s.start == 0)
            for r, pipe in candidate.pipelines()}
    assert held == {0: [26000, 32768], 1: [28000, 30000]}


def test_dealing_documents_first_balances_what_dealing_whole_sequences_cannot():
    # best-fit-decreasing makes three full sequences: two 32K documents and one of 64 short ones.
    # Dealt whole, one replica gets a long document and the short sequence (0.25 of the FLOPs left
    # to the other); dealt as documents first, each replica gets a long one and half of the short
    cfg = config(pp=2, dp=2, max_context=32768)
    lengths = [32768, 32768] + [512] * 64
    batch = [Sample(id=i, length=n) for i, n in enumerate(lengths)]
    cost = CostModel(cfg)
    candidates = sliced_sequence_plans(batch, 0, cfg)
    plans = [c.assemble([pipe for _, pipe in sorted(c.pipelines())]) for c in candidates]
    # (this batch in its order is also Megatron's fixed-length cut of itself: its sequences dealt in turn)
    assert {p.info["spread"] for p in plans} == {"sequences", "documents", EQUAL_TOKENS, "fixed-length"}
    tokens = {p.info["spread"]: sorted(sum(s.tokens for g in pipe.forward for s in g) for pipe in p.pipelines)
              for p in plans}
    # equal tokens: ceil(98304 / 65536) = 2 sequences a replica; the two long documents go to two of
    # them, 32 short ones to each of the others (16384 tokens), and each replica gets a long and a short
    assert tokens == {"sequences": [32768, 65536], "documents": [49152, 49152], EQUAL_TOKENS: [49152, 49152],
                      "fixed-length": [32768, 65536]}
    step = {spread: min(simulate(p, cost).step_time_s for p in plans if p.info["spread"] == spread)
            for spread in ("sequences", "documents")}
    assert step["documents"] < 0.9 * step["sequences"]
    # with one replica dealing the documents first packs what dealing the sequences packs: one of the two
    assert {c.assemble([pipe for _, pipe in c.pipelines()]).info["spread"]
            for c in sliced_sequence_plans(batch, 0, config(pp=2, dp=1, max_context=32768))} == {
        "sequences", EQUAL_TOKENS, "fixed-length"}


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 32768), min_size=1, max_size=60), dp=st.integers(1, 4))
def test_equal_token_sequences_are_as_many_as_the_fixed_length_cut_makes_and_keep_documents_whole(lengths, dp):
    cfg = config(pp=2, dp=dp, max_context=32768)
    batch = [Sample(id=i, length=n) for i, n in enumerate(lengths)]
    (own,) = [c for c in sliced_sequence_plans(batch, 0, cfg)
              if c.assemble([p for _, p in sorted(c.pipelines())]).info == {"num_slices": 1, "spread": EQUAL_TOKENS}]
    sequences = {r: [[(s.sample_id, s.start, s.end) for s in g] for g in pipe.forward] for r, pipe in own.pipelines()}
    count = -(-sum(lengths) // (32768 * dp))  # per replica, ceil(tokens / (context x replicas))
    made = [seq for r in range(dp) for seq in sequences[r]]
    assert all(len(sequences[r]) <= count for r in range(dp))  # fewer only where there are fewer documents
    assert len(made) == min(count * dp, len(lengths))
    assert sorted((i, 0, n) for i, n in enumerate(lengths)) == sorted(s for seq in made for s in seq)
    tokens = [sum(end - start for _, start, end in seq) for seq in made]
    assert max(tokens) - min(tokens) <= max(lengths)  # longest first into the emptiest: within one document
    if len(made) == count * dp:
        assert all(len(sequences[r]) == count for r in range(dp))


def test_equal_token_sequences_close_the_gap_an_extra_best_fit_sequence_opens():
    # stress probe seed 409, cell 12: best-fit-decreasing packs the batch's whole documents into 17
    # sequences where the fixed-length cut makes 16, and the replica given 9 runs 4.19 s, against
    # SlimPipe's 4.05 s on the cut pieces; as 16 sequences of about equal tokens they run 4.05 s
    cfg = build_config(model="llama3-8b", parallel=ParallelConfig(tp=4, pp=8, dp=2, cp=4),
                       train=TrainConfig(max_context=262144, global_batch_tokens=16384 * 256, recompute="full"))
    batch = stream_batches(load_dataset("wlbllm"), cfg, 1)[0]
    plan = make_planner("slimpack", cfg).plan(batch, step=0)
    assert plan.info[plan.info["candidate"]]["spread"] == EQUAL_TOKENS
    assert [len(pipe.forward) for pipe in plan.pipelines] == [64, 64]  # 8 sequences a replica, 8 slices each
    pieces, _ = pack_fixed_length(batch, 262144)
    slimpipe = simulate(make_planner("slimpipe", cfg).plan(pieces, step=0)).step_time_s
    ours = simulate(plan).step_time_s
    assert ours <= slimpipe and not simulate(plan).oom


def test_whole_sequences_are_a_candidate_in_plain_1f1b():
    from slimpack.schedule.builders import one_f_one_b

    cfg = config(pp=4, dp=2, max_context=32768)
    batch = synthetic_batch(4, 800_000, 32768)
    whole_sequences = [c for c in sliced_sequence_plans(batch, 0, cfg, first=("documents", 1))][:1]
    plan = whole_sequences[0].assemble([pipe for _, pipe in sorted(whole_sequences[0].pipelines())])
    assert plan.info == {"num_slices": 1, "spread": "documents"}
    for pipe in plan.pipelines:  # one group per sequence, each holding whole documents
        assert pipe.forward == pipe.backward and pipe.order == one_f_one_b(len(pipe.forward), 4)
        assert all(s.start == 0 for g in pipe.forward for s in g)
        assert all(sum(s.tokens for s in g) <= 32768 for g in pipe.forward)


def test_the_last_winning_sliced_candidate_is_tried_first_and_kept_in_the_state():
    from slimpack.strategies.slimpack.planner import SlimPackPlanner

    cfg = config(pp=4, dp=4, max_context=32768)
    batch = synthetic_batch(5, 1_600_000, 32768)
    keys = [(p.info["spread"], p.info["num_slices"]) for p in
            (c.assemble([pipe for _, pipe in sorted(c.pipelines())])
             for c in sliced_sequence_plans(batch, 0, cfg, first=("sequences", 8)))]
    assert keys[0] == ("sequences", 8) and len(set(keys)) == len(keys) == 18  # 3 spreads x n = 1..32
    planner = SlimPackPlanner(cfg)
    plan = planner.plan(batch, step=0)
    won = plan.info[plan.info["candidate"]]  # here the slice-level candidate beats SlimPack's own plan
    assert planner.state_dict()["sliced_first"] == [won["spread"], won["num_slices"]]
    restored = SlimPackPlanner(cfg)
    restored.load_state_dict(json.loads(json.dumps(planner.state_dict())))
    assert restored.state_dict() == planner.state_dict()


def test_at_a_short_context_slimpack_is_not_behind_a_baseline_with_fuller_micro_batches():
    # pydocs-like short documents at a 4K context, one pipeline without pipelining (tp 8): the
    # baselines run fastest with micro-batches of several sequences, which SlimPack's candidates
    # now include (caps doubling from 8K while plain 1F1B fits full micro-batches, up to 122,600
    # tokens here, and one doubling past that)
    from slimpack.config import ParallelConfig, TrainConfig, build_config
    from slimpack.strategies import make_planner
    from slimpack.strategies.micro_batches import micro_batch_caps

    cfg = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=1, dp=1),
                       train=TrainConfig(max_context=4096, global_batch_tokens=131072))
    assert micro_batch_caps(cfg) == [4096, 8192, 16384, 32768, 65536, 131072]
    batch = synthetic_batch(5, 131072, 4096)
    plan = make_planner("slimpack", cfg).plan(batch, step=0)
    assert plan.config == cfg  # a capped candidate's plan carries the user's config
    best = min(simulate(make_planner(name, build_config(
        model="llama2-7b", parallel=ParallelConfig(tp=8, pp=1, dp=1),
        train=TrainConfig(max_context=4096, global_batch_tokens=131072, micro_batch_tokens=cap))).plan(batch, step=0)
                        ).step_time_s for name in ("bfd", "kk", "bytescale") for cap in micro_batch_caps(cfg))
    assert plan.info["step_s"] <= best
    assert best < min(simulate(make_planner(name, cfg).plan(batch, step=0)).step_time_s for name in ("bfd", "kk"))


def test_no_cap_past_memorys_bound_where_the_bound_allows_no_doubling():
    from slimpack.config import ParallelConfig, TrainConfig, build_config
    from slimpack.cost import CostModel
    from slimpack.strategies.micro_batches import memory_token_cap, micro_batch_caps

    # the planner-latency layout: 128K contexts, memory holds about one context per micro-batch
    long = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=4, dp=8),
                        train=TrainConfig(max_context=131072, global_batch_tokens=16 * 2**20))
    assert memory_token_cap(CostModel(long)) < 2 * 131072
    assert micro_batch_caps(long) == [131072]
    # a replica's tokens bound the cap past memory's too: at 65,536 tokens per replica nothing
    # lies past the last doubling within the bound (122,600 tokens here)
    short = build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=1, dp=4),
                         train=TrainConfig(max_context=4096, global_batch_tokens=262144))
    assert micro_batch_caps(short) == [4096, 8192, 16384, 32768, 65536]



def test_a_lead_over_its_own_packing_skips_the_baselines_only_if_best_fit_decreasing_is_behind_too():
    # a stand-in for SlimPack's plan: best-fit-decreasing's own plan with a made-up step, and a
    # clear lead over "its own whole-sample packing" (0.5); slicing off, so only the whole-sample
    # candidates can replace it
    cfg = build_config(parallel=ParallelConfig(tp=4, pp=2, dp=2), train=TrainConfig(max_context=32768),
                       planner=PlannerConfig(use_slicing=False))
    cost = CostModel(cfg)
    batch = synthetic_batch(5, 800_000, 32768)
    reference = make_planner("bfd", cfg).plan(batch, step=0)
    reference_s = simulate(reference, cost).step_time_s

    def slimpack_at(step_s):
        return dataclasses.replace(reference, strategy="slimpack", info={"candidate": "slimpack", "step_s": step_s})

    # best-fit-decreasing within 5%: the lead is not clear, the candidates run, one at least as fast wins
    close = safest_plan(slimpack_at(1.04 * reference_s), batch, cost, fitting=True, lead=0.5)
    assert close.info["candidate"] in BASELINE_CANDIDATES and close.info["step_s"] <= reference_s
    # best-fit-decreasing more than 5% behind as well: the plan stands, no candidate is built
    ahead = slimpack_at(0.94 * reference_s)
    assert safest_plan(ahead, batch, cost, fitting=True, lead=0.5) is ahead


def test_above_the_candidates_sample_limit_best_fit_decreasing_alone_is_tried(monkeypatch):
    cfg = build_config(parallel=ParallelConfig(tp=4, pp=2, dp=2), train=TrainConfig(max_context=32768))
    cost = CostModel(cfg)
    batch = synthetic_batch(5, 800_000, 32768)
    monkeypatch.setattr(candidate_rules, "CANDIDATES_MAX_SAMPLES", len(batch) - 1)
    reference = make_planner("bfd", cfg).plan(batch, step=0)
    reference_s = simulate(reference, cost).step_time_s

    def slimpack_at(step_s):
        return dataclasses.replace(reference, strategy="slimpack", info={"candidate": "slimpack", "step_s": step_s})

    # behind best-fit-decreasing without a clear lead over its own packing: replaced by it (and by
    # nothing else: the other candidates are not built)
    behind = safest_plan(slimpack_at(1.01 * reference_s), batch, cost, fitting=True, lead=0.99)
    assert behind.info["candidate"] == "bfd" and behind.info["step_s"] == reference_s
    ahead = slimpack_at(0.999 * reference_s)
    assert safest_plan(ahead, batch, cost, fitting=True, lead=0.99) is ahead
    # with a clear lead over its own packing nothing is built, not even the reference
    clear = slimpack_at(1.01 * reference_s)
    assert safest_plan(clear, batch, cost, fitting=True, lead=0.5) is clear


@pytest.mark.parametrize("vpp", [1, 2])
def test_the_lazy_reference_is_best_fit_decreasings_plan_built_fullest_replica_first(vpp):
    cfg = build_config(parallel=ParallelConfig(tp=4, pp=2, dp=3, virtual_stages=vpp), train=TrainConfig(max_context=32768))
    batch = synthetic_batch(7, 600_000, 32768)
    candidate = candidate_rules.reference_candidate(batch, 0, cfg)
    built = list(candidate.pipelines())
    plan = candidate.assemble([pipe for _, pipe in sorted(built)])
    assert plan == make_planner("bfd", cfg).plan(batch, step=0)
    tokens = [sum(group_tokens(g) for g in pipe.forward) for _, pipe in built]
    assert tokens == sorted(tokens, reverse=True) and sorted(r for r, _ in built) == [0, 1, 2]


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30), context=st.integers(8, 40))
def test_the_fixed_length_cut_splits_no_document_exactly_when_it_makes_no_new_sample(lengths, context):
    samples = [Sample(id=i, length=n) for i, n in enumerate(lengths)]
    pieces, _ = pack_fixed_length(samples, context)
    assert candidate_rules.cuts_no_document(samples, context) == (len(pieces) == len(samples))


@pytest.mark.parametrize("dataset, model, context, per_gpu, layout, recompute", [
    ("cpython", "llama2-7b", 8192, 32768, (1, 8, 1, 1, 1), "none"),  # stress cell 94: SlimPipe 0.2% ahead without
    ("wlbllm", "qwen2.5-7b", 8192, 16384, (4, 4, 1, 1, 1), "selective"),  # cell 96: SlimPipe, fixed 0.4% ahead
    ("wlbllm", "qwen2.5-7b", 65536, 131072, (4, 2, 2, 2, 1), "none"),  # cell 157, interleaved: fixed 0.3% ahead
])
def test_on_the_fixed_length_pieces_slimpack_is_never_behind_slimpipe_or_fixed(dataset, model, context, per_gpu,
                                                                                layout, recompute):
    # a batch Megatron's cut has already made (as a corpus chunked to the context would be):
    # SlimPipe's and fixed's own plans are candidates, so SlimPack's step is at most theirs; on the
    # documents that cut splits some, and neither is a candidate
    tp, pp, vpp, cp, dp = layout
    cfg = build_config(model=model, parallel=ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, virtual_stages=vpp),
                       train=TrainConfig(max_context=context, global_batch_tokens=per_gpu * tp * pp * cp * dp,
                                         recompute=recompute))
    batch = stream_batches(load_dataset(dataset), cfg, 1)[0]
    pieces, _ = pack_fixed_length(batch, context)
    ours = simulate(make_planner("slimpack", cfg).plan(pieces, step=0))
    theirs = [simulate(make_planner(name, cfg).plan(pieces, step=0)) for name in ("fixed", "slimpipe")[:3 - vpp]]
    assert not ours.oom and all(not r.oom for r in theirs)
    assert ours.step_time_s <= min(r.step_time_s for r in theirs)
    assert candidate_rules.cuts_no_document(pieces, context) and not candidate_rules.cuts_no_document(batch, context)
    assert candidate_rules.uncut_fixed_plans(batch, 0, cfg) == []
    spreads = {c.assemble([p for _, p in sorted(c.pipelines())]).info["spread"] for c in sliced_sequence_plans(batch, 0, cfg)}
    assert candidate_rules.FIXED_LENGTH not in spreads
