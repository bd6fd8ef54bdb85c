"""SlimPack is memory-safe by construction and never behind the whole-sample baselines (issue 12)."""

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import slimpack.strategies.slimpack.candidates as candidates
from slimpack.config import ParallelConfig, PlannerConfig, TrainConfig, build_config
from slimpack.config.presets import cluster_preset
from slimpack.cost import CostModel
from slimpack.data import load_dataset
from slimpack.errors import ScheduleError, UserError
from slimpack.plan import Sample
from slimpack.plan.check import check_plan
from slimpack.schedule.default import activation_cap_tokens
from slimpack.sim import simulate
from slimpack.strategies import make_planner
from slimpack.strategies.slimpack.candidates import BASELINE_CANDIDATES
from slimpack.strategies.slimpack.memory import stage_peak_bytes
from slimpack.strategies.stream import stream_batches

GIB = 2**30


def _config(*, pp=2, dp=2, memory_gib=80.0, recompute="selective", context=32768, model="llama2-7b", tp=8, vpp=1):
    gpu = cluster_preset("h100-sxm")
    gpu = dataclasses.replace(gpu, memory_bytes=int(memory_gib * GIB))
    return build_config(model=model, gpu=gpu, parallel=ParallelConfig(tp=tp, pp=pp, dp=dp, virtual_stages=vpp),
                        train=TrainConfig(max_context=context, global_batch_tokens=1 << 20, recompute=recompute),
                        planner=PlannerConfig(use_milp=False))


def _batch(lengths):
    return [Sample(id=i, length=n) for i, n in enumerate(lengths)]


def test_the_last_stage_cap_counts_the_lm_head_logits():
    """Stage caps in tokens: (usable - states - working) / kept bytes per token, where the last
    stage's kept bytes include the float32 logits (vocab/tp x 4 bytes per token)."""
    config = _config(pp=4, dp=1)
    cost = CostModel(config)
    caps = activation_cap_tokens(config, cost, cp=1, largest_group_tokens=8192)
    usable = config.cluster.usable_memory_bytes
    working = cost.working_bytes(8192)
    middle = (usable - cost.model_state_bytes(1) - working) / cost.activation_bytes(1.0, virtual_stage=1)
    assert caps[1] == pytest.approx(middle)
    logits_per_token = 32000 / 8 * 4
    last_per_token = cost.activation_bytes(1.0, virtual_stage=3)
    assert last_per_token > cost.activation_bytes(1.0, virtual_stage=1) + logits_per_token - 1e-6
    assert caps[3] < caps[1]


@pytest.mark.parametrize("pp", [2, 4])
def test_under_interleaving_the_cap_counts_a_token_on_every_chunk_of_the_stage(pp):
    """A sample's forwards run on every chunk of a stage before its first backward there, so with
    2 virtual stages the stage keeps its tokens twice over half the layers each: the same cap as
    without interleaving (same layers, embedding and head per stage), not twice it (as when only
    the stage's first chunk was counted, which let DP-Merge put a 64K-token sample on too few
    replicas: tp1 pp2 vpp2 dp128 found no plan at textbooks 64K on 256 GPUs)."""
    plain, interleaved = _config(pp=pp, dp=1), _config(pp=pp, dp=1, vpp=2)
    cost = CostModel(interleaved)
    caps = activation_cap_tokens(interleaved, cost, cp=1, largest_group_tokens=8192)
    free = [interleaved.cluster.usable_memory_bytes - cost.model_state_bytes(s) - cost.working_bytes(8192)
            for s in range(pp)]
    assert caps == pytest.approx([free[s] / (cost.activation_bytes(1.0, virtual_stage=s)
                                             + cost.activation_bytes(1.0, virtual_stage=pp + s)) for s in range(pp)])
    assert caps == pytest.approx(activation_cap_tokens(plain, CostModel(plain), cp=1, largest_group_tokens=8192))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 32768), min_size=1, max_size=30), pp=st.sampled_from([1, 2, 4]),
       dp=st.sampled_from([1, 2]), memory_gib=st.sampled_from([40.0, 80.0]))
def test_order_peak_memory_equals_the_simulators(lengths, pp, dp, memory_gib):
    config = _config(pp=pp, dp=dp, memory_gib=memory_gib)
    cost = CostModel(config)
    try:
        plan = make_planner("slimpack", config).plan(_batch(lengths), step=0)
    except UserError:
        return
    result = simulate(plan)
    for p, pipe in enumerate(plan.pipelines):
        if pipe.order is None:
            continue  # a baseline candidate won: its 1F1B is checked by the planner the same way
        peaks = stage_peak_bytes(pipe, pipe.order, config, cost)
        simulated = [m.peak_bytes for m in result.memory if m.pipeline == p]
        assert peaks == pytest.approx(simulated, rel=1e-9)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(128, 65536), min_size=2, max_size=40), pp=st.sampled_from([1, 2, 4]),
       vpp=st.sampled_from([1, 1, 2]), dp=st.sampled_from([1, 2]), memory_gib=st.sampled_from([30.0, 45.0, 80.0]),
       recompute=st.sampled_from(["none", "selective", "full"]))
@example(lengths=[128, 128, 128, 65409], pp=2, vpp=2, dp=2, memory_gib=30.0, recompute="none")  # a replica with one sample
@example(lengths=[128] * 22 + [1228, 13732, 18540, 45240], pp=1, vpp=1, dp=2, memory_gib=30.0,
         recompute="none")  # wins on merged replicas (the whole batch at cp 2)
@example(lengths=[128, 28472], pp=1, vpp=1, dp=1, memory_gib=30.0, recompute="none")  # no cp holds its K and V
@example(lengths=[14055, 31234, 20248, 31235, 20249], pp=1, vpp=1, dp=2, memory_gib=80.0,
         recompute="none")  # kk's plan at 131,072-token micro-batches wins
def test_never_out_of_memory_nor_behind_where_a_baseline_fits(lengths, pp, vpp, dp, memory_gib, recompute):
    config = _config(pp=pp, dp=dp, memory_gib=memory_gib, recompute=recompute, context=65536,
                     vpp=vpp if pp > 1 else 1)
    batch = _batch(lengths)
    baseline_steps = []
    for name in BASELINE_CANDIDATES:
        try:
            baseline = make_planner(name, config).plan(batch, step=0)
        except ScheduleError:  # interleaving where no micro-batch can be split to a multiple of pp
            continue
        result = simulate(baseline)
        if not result.oom and not baseline.deferred:  # WLB-LLM's plan is of this batch only if it defers nothing
            baseline_steps.append(result.step_time_s)
    try:
        plan = make_planner("slimpack", config).plan(batch, step=0)
    except UserError as exc:
        assert not baseline_steps, f"slimpack found nothing while a baseline fits: {exc}"
        # the advice leaves cp out exactly where the longest sample overflows even on every replica merged
        widest = config.parallel.cp * config.parallel.dp
        beyond_cp = CostModel(config).sample_floor_bytes(max(lengths), cp=widest) > config.cluster.usable_memory_bytes
        assert ("; raise tp or pp," if beyond_cp else "; raise tp, cp or pp") in str(exc)
        return
    check_plan(plan)
    result = simulate(plan)
    if baseline_steps:
        assert not result.oom
        assert result.step_time_s <= min(baseline_steps) * (1 + 1e-9)
    name, merged, width = plan.info["candidate"].partition(" on ")
    name = re.sub(r" \([\d,]+-token micro-batches\)$", "", name)  # a baseline's plan at a larger cap
    assert name in ("slimpack", "fixed", *BASELINE_CANDIDATES) or name.startswith(
        ("sliced bfd", "bfd sequences by FLOPs", "sliced fixed-length", "fixed-length sequences",
         "sliced equal-token", "equal-token sequences"))
    assert not merged or width == f"{plan.info['merged_replicas']} merged replicas"


def test_keeps_up_with_wlb_where_it_defers_nothing(monkeypatch):
    """Stress probe seed 71, cell 3 (docs/stress-probes.md): without a pipeline, WLB-LLM's 4
    micro-batches per replica beat SlimPack's own 6 groups and kk's 5; its plan, which defers
    nothing there, is a candidate. Since the thirty-fifth session 4 sequences of equal tokens a
    replica (as many as the fixed-length cut makes) are one too, and a little faster still."""
    config = build_config(model="qwen2.5-7b", parallel=ParallelConfig(tp=1, pp=1, dp=4),
                          train=TrainConfig(max_context=16384, global_batch_tokens=262144, recompute="full"))
    batch = stream_batches(load_dataset("textbooks"), config, 1)[0]
    wlb = make_planner("wlb", config).plan(batch, step=0)
    assert not wlb.deferred
    plan = make_planner("slimpack", config).plan(batch, step=0)
    assert plan.info["candidate"] == "equal-token sequences in 1F1B"
    assert [len(pipe.forward) for pipe in plan.pipelines] == [len(pipe.forward) for pipe in wlb.pipelines] == [4] * 4
    step_s = simulate(plan).step_time_s
    assert step_s <= simulate(wlb).step_time_s
    assert step_s < plan.info["slimpack"]["step_s"]  # its own plan: slower
    # without that spread WLB-LLM's plan wins, as it is
    monkeypatch.setattr(candidates, "SEQUENCE_SPREADS", ("documents", "sequences"))
    plan = make_planner("slimpack", config).plan(batch, step=0)
    assert plan.info["candidate"] == "wlb"
    assert simulate(plan).step_time_s == pytest.approx(simulate(wlb).step_time_s, rel=1e-12)


def test_the_issue_regime_scaled_down_fits_and_keeps_up():
    """Issue 12's first row in miniature: many groups per pipeline at long context, where backward
    groups balanced on backward cost used to pile up activations and the last stage overflowed."""
    config = _config(pp=4, dp=1, memory_gib=40.0, context=131072)
    lengths = [131072, 90000, 70000, 40000] + [6000 + 997 * i for i in range(60)]
    batch = _batch(lengths)
    plan = make_planner("slimpack", config).plan(batch, step=0)
    result = simulate(plan)
    assert not result.oom
    baselines = [make_planner(name, config).plan(batch, step=0) for name in BASELINE_CANDIDATES]
    best = min(simulate(b).step_time_s for b in baselines if not b.deferred)
    assert result.step_time_s <= best * (1 + 1e-9)


def test_when_nothing_fits_one_error_says_what_would():
    config = _config(pp=1, dp=1, tp=1, memory_gib=80.0, context=262144, recompute="none")
    with pytest.raises(UserError, match=r"no plan of this batch fits.*even at cp 1 that sample needs at least "
                                        r"[0-9.]+ GiB per GPU.*; raise tp or pp, use --recompute full"):
        make_planner("slimpack", config).plan(_batch([262144]), step=0)


@pytest.mark.parametrize(("tp", "longest", "advice"), [
    (2, 221_167, "raise tp or pp, or cp with more GPUs, use --recompute full, or lower --max-context"),
    (2, 262_144, "raise tp or pp, use --recompute full, or lower --max-context"),
    (4, 221_167, None)])
def test_where_no_merge_can_hold_the_longest_sample_the_error_says_why(tp, longest, advice):
    """Issue 12's textbooks 256K probe in miniature (tp 2, pp 1, 8 replicas, no recomputation): every
    cp rank keeps the sample's whole K and V (256 KiB per token over 32 layers at tp 2: 54 GiB for
    221,167 tokens), so even all 8 replicas merged (cp 8) cannot hold it. With more GPUs a wider cp
    would (K and V plus 17.3 GiB of model states fit), but not for a 262,144-token sample (64 GiB of
    K and V): the error says which. tp 4 halves the K and V, and the batch fits on merged replicas."""
    config = _config(pp=1, dp=8, tp=tp, memory_gib=80.0, context=262144, recompute="none")
    batch = _batch([longest, 30_000, 8_000, 2_000])
    if advice is None:
        plan = make_planner("slimpack", config).plan(batch, step=0)
        assert not simulate(plan).oom
        return
    with pytest.raises(UserError) as error:
        make_planner("slimpack", config).plan(batch, step=0)
    message = str(error.value)
    assert "even over all 8 replicas merged (cp 8) that sample needs at least" in message
    assert message.endswith(advice)
    floor = float(message.split("needs at least ")[1].split(" GiB")[0])
    best = float(message.split("the best needs ")[1].split(" of ")[0])
    kv_gib = longest * 32 * (2 * 4096 / 2) * 2 / 2**30  # 32 layers of K and V, bf16, half the heads
    assert kv_gib < floor <= best  # at least the K and V; a floor below every plan's need
    assert ("at any cp" in message) == (longest == 262_144)


def test_interleaved_layouts_get_sliced_groups_and_beat_whole_samples():
    """Under vpp 2 with 10 samples of which one fills the context: the list-scheduled order lets
    SlimPack slice (here 8 symmetric groups, 0.889 s simulated) where whole samples in Megatron's
    interleaved 1F1B took 0.998 s (2 groups: the long sample is its own group). The whole-sample
    baselines pad their 3 micro-batches to 4 (``rounds_of``) and take 0.99-1.00 s."""
    config = _config(pp=2, dp=1, vpp=2, context=32768)
    batch = _batch([32768, 20000, 9000, 7000, 5000, 3000, 2500, 1200, 800, 300])
    plan = make_planner("slimpack", config).plan(batch, step=0)
    check_plan(plan)
    assert any(s.start > 0 for pipe in plan.pipelines for g in pipe.forward for s in g)  # sliced
    result = simulate(plan)
    assert not result.oom and result.step_time_s < 0.9
    whole = dataclasses.replace(config, planner=dataclasses.replace(config.planner, use_slicing=False))
    assert result.step_time_s < 0.9 * simulate(make_planner("slimpack", whole).plan(batch, step=0)).step_time_s


def test_a_stage_never_holds_more_than_the_smallest_cap_before_it():
    """Stage 0 must run at least the forwards stage 1 runs before each backward, so a larger cap on
    stage 1 must not push stage 0 past its own (1F1B with look-ahead 2, 6 unit groups, caps 1 and 5)."""
    from slimpack.schedule.builders import dependency_aware

    order = dependency_aware(list(range(1, 7)), num_forward=6, pp=2, lookahead=2, forward_tokens=[1.0] * 6,
                             backward_tokens=[1.0] * 6, cap_tokens=[1.0, 5.0])
    for stage in order:
        held = most = 0
        for action in stage:
            held += 1 if action.kind == "F" else 0
            most = max(most, held)
            held -= 1 if action.kind == "B" else 0
        assert most == 1


def test_the_fallback_ladder_slices_finer_groups_when_the_search_picked_whole_samples():
    """Stress cell 10 on the pieces of Megatron's fixed-length cut (qwen2.5-7b, tp 2, pp 2, 128K
    context, 1M tokens of pydocs): the search picks whole samples in 64 groups (77.3 GiB: the
    35,018-token piece's group, with its logits, on the last stage), and finer groups without
    slicing cannot split that piece. 256 sliced groups fit (75.3 of 76.6 GiB)."""
    from slimpack.strategies.fixed import pack_fixed_length

    config = build_config(model="qwen2.5-7b", parallel=ParallelConfig(tp=2, pp=2, dp=1),
                          train=TrainConfig(max_context=131072, global_batch_tokens=1 << 20, recompute="selective"))
    batch = stream_batches(load_dataset("pydocs"), config, 1)[0]
    pieces, _ = pack_fixed_length(batch, config.train.max_context)
    plan = make_planner("slimpack", config).plan(pieces, step=0)
    assert plan.info["slicing"] is False and plan.info["memory_fallback_pipelines"] == 1
    assert max(len(pipe.forward) for pipe in plan.pipelines) == 4 * plan.info["num_groups"]
    check_plan(plan)
    assert not simulate(plan).oom
