"""The pipeline over torch.distributed (2 gloo processes, tiny model, float64): loss and every
parameter gradient equal the single-process run of the same plan; a dead rank fails the others fast."""

from __future__ import annotations

import dataclasses

import pytest
from dist_workers import (
    early_exit,
    gradient_check,
    hanging_rank,
    hf_gradient_check,
    tied_embedding_after_steps,
)

from helpers import config, write_hf_config
from slimpack.config import ParallelConfig, TrainConfig, build_config
from slimpack.config.hf import resolve_model
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice
from slimpack.runtime.launch import LaunchError, spawn
from slimpack.runtime.mesh import Mesh
from slimpack.runtime.verify import TRANSFORMERS_FLOAT64_TOLERANCE
from slimpack.strategies import make_planner

pytestmark = pytest.mark.distributed

LENGTHS = (90, 40, 130, 25, 60, 70, 33, 48)


def _slimpack_plan(pp: int, dp: int) -> Plan:
    cfg = config(pp=pp, dp=dp, model="tiny", max_context=256, global_batch_tokens=512)
    batch = [Sample(id=i, length=n) for i, n in enumerate(LENGTHS)]
    return make_planner("slimpack", cfg).plan(batch, step=0)


def _layout_plan(*, tied: bool = False, model: str = "tiny", **parallel: int) -> Plan:
    """A SlimPack plan of ``model`` (the tiny one by default, its embedding tied as the LM head with
    ``tied``) for a tp/cp/pp/dp layout."""
    model = dataclasses.replace(resolve_model(model), tie_embeddings=tied or resolve_model(model).tie_embeddings)
    cfg = build_config(model=model, parallel=ParallelConfig(**parallel),
                       train=TrainConfig(max_context=256, global_batch_tokens=512))
    return make_planner("slimpack", cfg).plan([Sample(id=i, length=n) for i, n in enumerate(LENGTHS)], step=0)


def _merged_plus_ordinary_plan(merged_replicas: tuple[int, int] = (0, 1), single: int = 2) -> Plan:
    """dp 3: two replicas merged into a cp-2 pipeline for a long, sliced sample with asymmetric
    groups; the third an ordinary pipeline of short samples."""
    s = [Slice(0, 0, 120), Slice(0, 120, 200), Slice(1, 0, 30)]
    merged = PipelinePlan(replicas=merged_replicas, cp=2, forward=((s[0],), (s[1], s[2])),
                          backward=((s[1],), (s[2], s[0])))
    short = [Slice(2, 0, 50), Slice(3, 0, 41), Slice(4, 0, 7)]
    ordinary = PipelinePlan(replicas=(single,), cp=1, forward=((short[0],), (short[1], short[2])),
                            backward=((short[0],), (short[1], short[2])))
    samples = tuple(Sample(id=i, length=n) for i, n in enumerate((200, 30, 50, 41, 7)))
    return Plan(config=config(pp=1, dp=3, model="tiny", max_context=256), strategy="hand", samples=samples,
                pipelines=(merged, ordinary))


def _merged_plan() -> Plan:
    """dp 2, pp 1: SlimPack merges both replicas into one CP pipeline for this batch (DP-Merge)."""
    cfg = config(pp=1, dp=2, model="llama2-7b", max_context=2048, global_batch_tokens=4096)
    lengths = (1500, 100, 150, 80, 60, 120, 90, 40, 200, 70, 30, 50)
    plan = make_planner("slimpack", cfg).plan([Sample(id=i, length=n) for i, n in enumerate(lengths)], step=0)
    assert [p.replicas for p in plan.pipelines] == [(0, 1)]
    return plan


def _asymmetric_pipeline() -> PipelinePlan:
    """Replica 0: sample 0 (100 tokens) in three slices beside samples 1 (30) and 2 (50), forward and
    backward grouped differently."""
    s = [Slice(0, 0, 40), Slice(0, 40, 70), Slice(0, 70, 100), Slice(1, 0, 30), Slice(2, 0, 50)]
    return PipelinePlan(replicas=(0,), cp=1, forward=((s[0],), (s[1], s[3]), (s[2], s[4])),
                        backward=((s[4],), (s[2], s[1]), (s[3], s[0])))


def _asymmetric_plan(model: str = "tiny") -> Plan:
    """pp 2, dp 1: ``_asymmetric_pipeline``."""
    samples = (Sample(id=0, length=100), Sample(id=1, length=30), Sample(id=2, length=50))
    return Plan(config=config(pp=2, dp=1, model=model, max_context=256), strategy="hand", samples=samples,
                pipelines=(_asymmetric_pipeline(),))


def _check_hf(results: list[dict]) -> None:
    for r in results:
        assert abs(r["loss"] - r["ref_loss"]) <= TRANSFORMERS_FLOAT64_TOLERANCE * abs(r["ref_loss"])
        assert max(r["errors"].values()) < TRANSFORMERS_FLOAT64_TOLERANCE, r["errors"]


def _check(results: list[dict]) -> float:
    worst = 0.0
    for r in results:
        assert r["whole_gradients"] == []  # each rank keeps its shard's gradient, as the memory model counts
        assert abs(r["loss"] - r["ref_loss"]) <= 1e-12 * abs(r["ref_loss"])
        assert r["actions"] > 0
        assert abs(r["loss"] - r["unsliced_loss"]) <= 1e-12 * abs(r["unsliced_loss"])
        worst = max(worst, *r["errors"].values(), *r["unsliced_errors"].values())
    assert worst < 1e-10, worst
    return worst


def test_mesh_layout():
    """tp innermost, then cp, dp, pp (the cost model's rank order)."""
    mesh = Mesh(dp=2, pp=3)
    assert [mesh.coords(r) for r in range(6)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    assert mesh.stage_ranks(1) == (2, 3)
    assert (mesh.peer(4, 0), mesh.peer(1, 2)) == (0, 5)  # same replica, other stage
    big = Mesh(tp=2, cp=2, dp=3, pp=2)
    assert big.world_size == 24 and big.rank(2, 1, cp_rank=1, tp_rank=0) == ((1 * 3 + 2) * 2 + 1) * 2
    assert all(big.rank(*big.position(r)[:2], cp_rank=big.position(r).cp_rank,
                        tp_rank=big.position(r).tp_rank) == r for r in range(24))
    assert big.stage_ranks(0, tp_rank=1) == (1, 3, 5, 7, 9, 11)  # dp x cp ranks with the same shards
    merged = PipelinePlan(replicas=(1, 2), cp=4, forward=(), backward=())
    assert big.cp_ranks(merged, 1, tp_rank=1) == (17, 19, 21, 23)  # consecutive replicas: one block
    assert big.cp_shard(merged, 21) == (2, 4)


def test_mesh_checks_the_plan_layout():
    plan = _asymmetric_plan()
    with pytest.raises(ValueError, match=r"the plan is for tp=1 x cp=1 x dp=1 x pp=2, the mesh is tp=2"):
        Mesh(tp=2, dp=1, pp=2).check_plan(plan)


@pytest.mark.parametrize("pp,dp", [(2, 1), (1, 2)])
def test_slimpack_plan_gradients_match_one_process(pp, dp):
    plan = _slimpack_plan(pp, dp)
    results = spawn(gradient_check, 2, (plan, 0), timeout_s=120)
    assert {(r["replica"], r["stage"]) for r in results} == {Mesh(dp=dp, pp=pp).coords(r) for r in range(2)}
    _check(results)


def test_interleaved_virtual_stages():
    """pp 2 x 2 virtual stages: each rank runs chunks s and s + 2; chunk 1 -> 2 crosses back to rank 0."""
    cfg = config(pp=2, dp=1, vpp=2, model="tiny", max_context=256, global_batch_tokens=1024)
    lengths = (200, 180, 220, 150, 60, 70, 33, 48)
    plan = make_planner("fixed", cfg).plan([Sample(id=i, length=n) for i, n in enumerate(lengths)], step=0)
    assert len(plan.pipelines[0].forward) == 4
    results = spawn(gradient_check, 2, (plan, 0), timeout_s=120)
    assert [r["actions"] for r in results] == [16, 16]
    _check(results)


def test_asymmetric_groups_over_two_stages():
    results = spawn(gradient_check, 2, (_asymmetric_plan(), 1), timeout_s=120)
    _check(results)


def test_merged_pipeline_is_context_parallel_over_its_replicas():
    """DP-Merge: both replicas run the merged pipeline, each on its zigzag half of every slice."""
    plan = _merged_plan()
    results = spawn(gradient_check, 2, (plan, 2), timeout_s=120)
    assert [r["actions"] for r in results] == [2, 2]
    total = sum(s.length for s in plan.samples)
    assert sum(r["rows"] for r in results) == total and all(abs(r["rows"] - total / 2) <= 8 for r in results)
    _check(results)


# No wall-clock asserts below: ``spawn``'s own timeout bounds each run (a run past it raises a
# LaunchError that says "timed out", which none of these tests expects), the messages show the cause.

def test_dead_rank_fails_the_others_quickly(tmp_path):
    with pytest.raises(LaunchError) as info:
        spawn(early_exit, 2, (_slimpack_plan(2, 1), str(tmp_path / "rank0-ready")), timeout_s=60, pg_timeout_s=20)
    text = str(info.value)
    assert "rank 1: exited with code 7" in text
    survivor = info.value.results[0]
    assert survivor is not None
    assert survivor["error"].startswith("PeerFailure: rank 0:"), survivor["error"]


def test_hanging_rank_is_named_within_the_timeout(tmp_path):
    rank0, _ = spawn(hanging_rank, 2, (_slimpack_plan(2, 1), str(tmp_path / "rank0-done")), timeout_s=60,
                     pg_timeout_s=30)
    assert rank0["error"] is not None
    assert rank0["error"].startswith("PeerFailure: rank 0:") and "1 failed to pass monitoredBarrier" in rank0["error"], rank0["error"]


def test_tp2_plan_gradients_match_one_process():
    plan = _layout_plan(tp=2)
    results = spawn(gradient_check, 2, (plan, 0), timeout_s=120)
    assert [r["position"] for r in results] == [(0, 0, 0, 0), (0, 0, 0, 1)]
    assert results[0]["rows"] == results[1]["rows"] == sum(LENGTHS)  # tp ranks see every token
    _check(results)


def test_cp2_layout_shards_every_sample():
    plan = _layout_plan(cp=2)
    assert {p.cp for p in plan.pipelines} == {2}
    results = spawn(gradient_check, 2, (plan, 0), timeout_s=120)
    assert [r["position"] for r in results] == [(0, 0, 0, 0), (0, 0, 1, 0)]
    assert sum(r["rows"] for r in results) == sum(LENGTHS) and abs(results[0]["rows"] - results[1]["rows"]) <= 8
    _check(results)


def test_cp2_rank_without_tokens_in_a_group():
    """A 1-token document alone in a group: cp rank 1 holds none of its rows, but still takes part in
    the K/V gather and, in backward, its reduce-scatter (it used to fail, then hang)."""
    s = [Slice(0, 0, 1), Slice(1, 0, 20), Slice(1, 20, 41), Slice(2, 0, 3)]
    pipe = PipelinePlan(replicas=(0,), cp=2, forward=((s[0],), (s[1], s[3]), (s[2],)),
                        backward=((s[2],), (s[3],), (s[1], s[0])))
    cfg = build_config(model="tiny", parallel=ParallelConfig(cp=2), train=TrainConfig(max_context=256))
    samples = (Sample(id=0, length=1), Sample(id=1, length=41), Sample(id=2, length=3))
    results = spawn(gradient_check, 2, (Plan(config=cfg, strategy="hand", samples=samples, pipelines=(pipe,)), 0),
                    timeout_s=120)
    assert [r["rows"] for r in results] == [23, 22]  # 1 + 10 + 11 + 1 and 0 + 10 + 10 + 2: zigzag quarters
    _check(results)


@pytest.mark.slow
@pytest.mark.parametrize(("merged", "single", "rows"), [((0, 1), 2, [115, 115, 98]), ((0, 2), 1, [115, 98, 115])])
def test_dp_merge_pair_beside_an_ordinary_replica(merged, single, rows):
    """3 ranks: the merged pair runs the outlier context-parallel, each rank its zigzag share of
    every slice; the third replica its own pipeline; gradients summed over dp x cp. The pair need
    not be consecutive replicas (the planner puts a merged group on one node where it can)."""
    plan = _merged_plus_ordinary_plan(merged, single)
    results = spawn(gradient_check, 3, (plan, 3), timeout_s=300)
    # slices of 120, 80 and 30 tokens in quarters: each merged rank holds 30+30, 20+20 and 7+8 (or 8+7)
    assert [r["rows"] for r in results] == rows
    _check(results)


@pytest.mark.parametrize("layout", [{"pp": 2}, {"pp": 2, "virtual_stages": 2}])
def test_tied_embedding_over_two_stages(layout):
    """The first stage's embedding and the last stage's head are one tensor of the tiny model: each
    end's gradient is its own use's until the pair sums them, then both equal the unsliced
    model's, which holds the sum (chunk 0 and chunk 3 under interleaving)."""
    plan = _layout_plan(tied=True, **layout)
    results = spawn(gradient_check, 2, (plan, 4), timeout_s=120)
    assert [r["position"][1] for r in results] == [0, 1]
    assert all("embedding.weight" in r["errors"] for r in results)  # each end holds the tied tensor
    _check(results)


def test_tied_embedding_copies_stay_equal_over_optimizer_steps():
    """The first stage's embedding and the last stage's head copy take the same AdamW steps: after
    three, they moved and are still bit for bit equal."""
    first, last = spawn(tied_embedding_after_steps, 2, (_layout_plan(tied=True, pp=2), 3), timeout_s=120)
    assert (first["stage"], last["stage"]) == (0, 1)
    assert first["before"] == last["before"] and first["after"] != first["before"]
    assert first["after"] == last["after"]


def test_tied_embedding_under_tensor_parallelism():
    """tp 2: the embedding's vocabulary rows are split over the ranks, and the head is the same
    split matrix (its logits vocabulary-parallel), so each rank's shard gets both uses' gradient."""
    results = spawn(gradient_check, 2, (_layout_plan(tied=True, tp=2), 6), timeout_s=120)
    assert [r["position"][3] for r in results] == [0, 1]
    _check(results)


@pytest.mark.slow
def test_tied_embedding_over_two_stages_under_tensor_parallelism():
    """tp 2 x pp 2: each tp rank of the first stage sums its vocabulary shard with the same tp rank
    of the last stage (ranks 0 and 2, 1 and 3)."""
    results = spawn(gradient_check, 4, (_layout_plan(tied=True, tp=2, pp=2), 7), timeout_s=300)
    assert [r["position"][1::2] for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    _check(results)


@pytest.mark.slow
def test_tied_embedding_over_two_stages_and_two_replicas():
    """pp 2 x dp 2: each replica's ends sum the embedding after each stage's all-reduce over the
    replicas (ranks 0 and 2, 1 and 3)."""
    plan = _layout_plan(tied=True, pp=2, dp=2)
    results = spawn(gradient_check, 4, (plan, 5), timeout_s=300)
    assert sorted(r["position"][:2] for r in results) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    _check(results)


@pytest.mark.slow
def test_cp2_by_pp2_on_four_ranks():
    """Each stage's cp ranks send their own rows of a group to the same cp rank of the next stage."""
    plan = _layout_plan(cp=2, pp=2)
    results = spawn(gradient_check, 4, (plan, 0), timeout_s=300)
    assert [r["position"] for r in results] == [(0, 0, 0, 0), (0, 0, 1, 0), (0, 1, 0, 0), (0, 1, 1, 0)]
    assert results[0]["rows"] + results[1]["rows"] == sum(LENGTHS) == results[2]["rows"] + results[3]["rows"]
    _check(results)


def test_hugging_face_model_over_pp2_dp2(tmp_path):
    """transformers' Llama on 4 ranks (pp 2 x dp 2), both pipelines sliced with asymmetric groups:
    loss and every gradient equal the model's own unpacked run of every sample."""
    pytest.importorskip("transformers")
    path = write_hf_config(tmp_path / "config.json")
    sliced = _asymmetric_pipeline()
    t = [Slice(3, 0, 25), Slice(3, 25, 60), Slice(4, 0, 45), Slice(4, 45, 48)]
    other = PipelinePlan(replicas=(1,), cp=1, forward=((t[0], t[2]), (t[1], t[3])),
                         backward=((t[3],), (t[1], t[2]), (t[0],)))
    lengths = (100, 30, 50, 60, 48)
    plan = Plan(config=config(pp=2, dp=2, model=path, max_context=256), strategy="hand",
                samples=tuple(Sample(id=i, length=n) for i, n in enumerate(lengths)), pipelines=(sliced, other))
    assert not any(p.symmetric for p in plan.pipelines)
    results = spawn(hf_gradient_check, 4, (plan, path, 0), timeout_s=300)
    assert sorted(r["position"][:2] for r in results) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    _check_hf(results)


def test_hugging_face_model_with_tied_embeddings_over_two_stages(tmp_path):
    """transformers' Qwen2 with ``tie_word_embeddings`` (its ``lm_head`` is ``embed_tokens``) over pp 2,
    a sliced sample with asymmetric groups: both ends hold the embedding's whole gradient."""
    pytest.importorskip("transformers")
    path = write_hf_config(tmp_path / "config.json", "qwen2", tie_word_embeddings=True)
    plan = _asymmetric_plan(model=path)
    assert plan.config.model.tie_embeddings
    results = spawn(hf_gradient_check, 2, (plan, path, 0), timeout_s=300)
    assert [r["position"][1] for r in results] == [0, 1]
    assert all("hf.model.embed_tokens.weight" in r["errors"] for r in results)  # each end holds the tied tensor
    _check_hf(results)


@pytest.mark.parametrize("layout", [{"tp": 2}, {"tp": 2, "pp": 2}])
def test_hugging_face_model_with_tied_embeddings_under_tensor_parallelism(tmp_path, layout):
    """transformers' tied Qwen2 at tp 2 (and tp 2 x pp 2): ``embed_tokens`` is split once by
    vocabulary rows and ``lm_head`` re-tied to the split tensor, its logits vocabulary-parallel."""
    pytest.importorskip("transformers")
    path = write_hf_config(tmp_path / "config.json", "qwen2", tie_word_embeddings=True)
    plan = _layout_plan(model=path, **layout)
    results = spawn(hf_gradient_check, 2 * layout.get("pp", 1), (plan, path, 0), timeout_s=300)
    assert all("hf.model.embed_tokens.weight" in r["errors"] for r in results)
    assert all(r["shards"]["hf.model.embed_tokens.weight"] == (32, 32) for r in results)  # 64 rows split in two
    _check_hf(results)


@pytest.mark.slow
def test_tp2_by_cp2_on_four_ranks():
    """Sequence-parallel TP inside each cp rank: the cp K/V gather carries the rank's K/tp KV heads."""
    plan = _layout_plan(tp=2, cp=2)
    results = spawn(gradient_check, 4, (plan, 0), timeout_s=300)
    assert [r["position"] for r in results] == [(0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 0, 1, 1)]
    assert results[0]["rows"] == results[1]["rows"] and results[2]["rows"] == results[3]["rows"]
    assert results[0]["rows"] + results[2]["rows"] == sum(LENGTHS)  # tp ranks share their cp rank's rows
    _check(results)
