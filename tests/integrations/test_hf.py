"""Padding-free batches for Hugging Face: the collator's format, every rank's micro-batches, and a
tiny LlamaForCausalLM trained with DDP on 2 gloo processes equal to unpacked training."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_workers import (  # noqa: E402
    MAX_CONTEXT,
    HandStep,
    hf_llama_config,
    token_rows,
    train_hand_plans,
    train_packed,
    train_unpacked,
)

from slimpack.config import ParallelConfig, TrainConfig, build_config, resolve_model  # noqa: E402
from slimpack.data import Dataset, GlobalBatchSampler, SamplerConfig  # noqa: E402
from slimpack.errors import UserError  # noqa: E402
from slimpack.integrations.hf import PlanBatchSampler, TokenRows, packed_batch, plan_data_loader  # noqa: E402
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice  # noqa: E402
from slimpack.runtime.launch import spawn  # noqa: E402

LENGTHS = [17, 90, 33, 128, 5, 64, 70, 12, 101, 46, 58, 9, 120, 77, 31, 250, 40, 66, 23, 88]
BATCH_TOKENS = 512


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """The planning config of the tiny HF Llama, read from the config.json transformers writes."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    hf_llama_config().save_pretrained(directory)
    model = resolve_model(str(directory))
    return build_config(model=model, parallel=ParallelConfig(dp=2),
                        train=TrainConfig(max_context=MAX_CONTEXT, global_batch_tokens=BATCH_TOKENS))


def test_packed_batch_matches_transformers_flattening_collator():
    from transformers import DataCollatorWithFlattening

    features = [{"input_ids": [5, 6, 7]}, {"input_ids": [8]}, {"input_ids": [9, 10, 11, 12]}]
    ours = packed_batch(features)
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features, return_tensors="pt")
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
        else:
            assert ours[key] == value, key
    assert ours["labels"].tolist() == [[-100, 6, 7, -100, -100, 10, 11, 12]]
    assert ours["cu_seq_lens_q"].tolist() == [0, 3, 4, 8]


def test_every_rank_gets_the_same_count_and_every_sample_once(config):
    rows = token_rows(LENGTHS, seed=1)
    loaders = [plan_data_loader(rows, config, rank=r, num_steps=3) for r in range(2)]
    counts = [loader.batch_sampler.micro_batches_per_step for loader in loaders]
    assert counts[0] == counts[1] and all(c >= 1 for c in counts[0])
    # the micro-batches of both ranks hold exactly the sampler's batches, token for token
    sampler = GlobalBatchSampler(Dataset(name="t", lengths=LENGTHS, source="t"),
                                 SamplerConfig(global_batch_tokens=BATCH_TOKENS, max_context=MAX_CONTEXT))
    expected = sorted(tuple(rows[s.doc_index]["input_ids"][s.chunk * MAX_CONTEXT:][:s.length])
                      for step in range(3) for s in sampler.batch_at(step).samples)
    got = []
    for loader in loaders:
        for batch in loader:
            ids, cu = batch["input_ids"][0].tolist(), batch["cu_seq_lens_q"].tolist()
            got.extend(tuple(ids[a:b]) for a, b in zip(cu, cu[1:], strict=False))
    assert sorted(got) == expected
    # the 250-token document became a 128-token and a 122-token sample (chunks at the context)
    assert sum(1 for g in got if len(g) == 122) == 1


def test_cut_documents_packs_the_pieces_text(config):
    """With cut_documents the micro-batches hold the pieces of the fixed-length cut, each its own
    document's tokens from its offset: every step's pieces, read in order, are its batch's text."""
    from collections import Counter

    rows = token_rows(LENGTHS, seed=1)
    cut = dataclasses.replace(config, train=dataclasses.replace(config.train, cut_documents=True))
    loaders = [plan_data_loader(rows, cut, rank=r, num_steps=3) for r in range(2)]
    pieces = []
    for loader in loaders:
        for batch in loader:
            ids, cu = batch["input_ids"][0].tolist(), batch["cu_seq_lens_q"].tolist()
            pieces.extend(ids[a:b] for a, b in zip(cu, cu[1:], strict=False))
    sampler = GlobalBatchSampler(Dataset(name="t", lengths=LENGTHS, source="t"),
                                 SamplerConfig(global_batch_tokens=BATCH_TOKENS, max_context=MAX_CONTEXT))
    chunks = [s for step in range(3) for s in sampler.batch_at(step).samples]
    assert len(pieces) > len(chunks)  # the cut made pieces
    # every token position of the batches' chunks in exactly as many pieces as chunks: nothing lost or
    # repeated, and each piece is its row's text at its position
    positions = Counter((s.doc_index, t) for s in chunks for t in range(s.chunk * MAX_CONTEXT,
                                                                       s.chunk * MAX_CONTEXT + s.length))
    keys = [key for loader in loaders for mb in loader.batch_sampler for key in mb]
    assert Counter((row, t) for row, start, end in keys for t in range(start, end)) == positions
    assert sorted(map(tuple, pieces)) == sorted(tuple(rows[row]["input_ids"][start:end]) for row, start, end in keys)


def _sliced_plan(config, second_replica: tuple[int, ...] = (2, 3)) -> Plan:
    """Replica 0: sample 0 in two slices (groups [0a], [0b, 1]); replica 1: one group of whole samples."""
    lengths = {0: 100, 1: 30, 2: 40, 3: 20}
    s = [Slice(0, 0, 64), Slice(0, 64, 100), Slice(1, 0, 30)]
    first = PipelinePlan(replicas=(0,), cp=1, forward=((s[0],), (s[1], s[2])), backward=((s[0],), (s[1], s[2])))
    group = tuple(Slice(i, 0, lengths[i]) for i in second_replica)
    second = PipelinePlan(replicas=(1,), cp=1, forward=(group,), backward=(group,))
    samples = tuple(Sample(id=i, length=lengths[i]) for i in (0, 1, *second_replica))
    return Plan(config=config, strategy="hand", samples=samples, pipelines=(first, second))


def test_sliced_plans_are_refused_or_lowered(config):
    step = HandStep(_sliced_plan(config))
    with pytest.raises(UserError, match="has slices or asymmetric backward groups"):
        PlanBatchSampler([step], rank=0, max_context=MAX_CONTEXT)
    lowered = [PlanBatchSampler([step], rank=r, max_context=MAX_CONTEXT, lower=True) for r in (0, 1)]
    # sample 0 runs whole where its first slice was; replica 1's one micro-batch stays whole and a
    # padding micro-batch (empty) follows it, so that both replicas run 2 micro-batches
    assert list(lowered[0]) == [[(0, 0, 100)], [(1, 0, 30)]]
    assert list(lowered[1]) == [[(2, 0, 40), (3, 0, 20)], []]
    assert lowered[0].loss_tokens(0) == 99 + 29 + 39 + 19
    # replica 1 holding one sample: replica 0's two micro-batches stay apart (never merged) and
    # replica 1 ends with a padding micro-batch, empty, which adds no loss token
    single = [PlanBatchSampler([HandStep(_sliced_plan(config, (2,)))], rank=r, max_context=MAX_CONTEXT, lower=True)
              for r in (0, 1)]
    assert list(single[0]) == [[(0, 0, 100)], [(1, 0, 30)]] and list(single[1]) == [[(2, 0, 40)], []]
    assert single[0].micro_batches_per_step == single[1].micro_batches_per_step == [2]
    assert single[1].loss_tokens(0) == 99 + 29 + 39


def test_a_padding_micro_batch_becomes_one_ignored_token():
    empty = packed_batch([])
    assert set(empty) == set(packed_batch([{"input_ids": [5, 6]}]))
    assert empty["input_ids"].dtype == empty["labels"].dtype == empty["position_ids"].dtype == torch.long
    assert empty["input_ids"].tolist() == [[0]] and empty["labels"].tolist() == [[-100]]
    assert empty["position_ids"].tolist() == [[0]]
    assert empty["cu_seq_lens_q"].dtype == torch.int32 and empty["cu_seq_lens_q"].tolist() == [0, 1]
    assert torch.equal(empty["cu_seq_lens_k"], empty["cu_seq_lens_q"])
    assert empty["max_length_q"] == empty["max_length_k"] == 1
    # a DataLoader hands the sampler's empty micro-batch to the collator as no samples
    sampler = PlanBatchSampler([HandStep(_sliced_plan(build_config(parallel=ParallelConfig(dp=2)), (2,)))],
                               rank=1, max_context=MAX_CONTEXT, lower=True)
    rows = token_rows([100, 30, 40], seed=0)
    batches = list(torch.utils.data.DataLoader(TokenRows(rows), batch_sampler=sampler, collate_fn=packed_batch))
    assert [b["input_ids"][0].tolist() for b in batches] == [rows[2]["input_ids"], [0]]


def _step_samples(rows, steps: int) -> list[list[list[int]]]:
    """Token lists of every sample of the sampler's first ``steps`` global batches of ``LENGTHS``."""
    sampler = GlobalBatchSampler(Dataset(name="t", lengths=LENGTHS, source="t"),
                                 SamplerConfig(global_batch_tokens=BATCH_TOKENS, max_context=MAX_CONTEXT))
    return [[rows[s.doc_index]["input_ids"][s.chunk * MAX_CONTEXT:][:s.length]
             for s in sampler.batch_at(step).samples] for step in range(steps)]


def _assert_trains_as_unpacked(results: list[dict], step_samples: list[list[list[int]]], lr: float,
                               padding_rows: int = 0) -> None:
    """Loss, first gradients and final parameters of every rank equal unpacked training's, and the
    two ranks together trained each sample once, plus ``padding_rows`` one-token padding rows."""
    reference = train_unpacked(step_samples, lr)
    assert results[0]["micro_batches"] == results[1]["micro_batches"]
    for got in results:
        assert got["losses"] == pytest.approx(reference["losses"], rel=1e-12)
        for name, grad in reference["first_grads"].items():
            scale = float(grad.abs().max()) + 1e-30
            assert float((got["first_grads"][name] - grad).abs().max()) / scale < 1e-10, name
        for name, param in reference["params"].items():
            assert torch.allclose(got["params"][name], param, rtol=0, atol=1e-12), name
    trained = sorted(results[0]["sample_lengths"] + results[1]["sample_lengths"])
    assert trained == sorted([1] * padding_rows + [len(s) for step in step_samples for s in step])


@pytest.mark.distributed
def test_ddp_training_from_packed_batches_equals_unpacked_training(config):
    rows = token_rows(LENGTHS, seed=2)
    steps, lr = 3, 0.5
    # kk: several micro-batches per rank (slimpack packs this small batch into one per rank at
    # pp = 1), so gradient accumulation under DDP's no_sync is exercised too
    results = spawn(train_packed, 2, (rows, config, steps, lr, "kk"), timeout_s=240)
    assert sum(results[0]["micro_batches"]) > steps  # really packed into several micro-batches
    _assert_trains_as_unpacked(results, _step_samples(rows, steps), lr)


def _hand_plan(config, replicas: list[list[list[int]]], rows) -> Plan:
    """Whole-sample groups of row ids per replica (plan sample id = row)."""
    pipes = tuple(PipelinePlan(replicas=(r,), cp=1, forward=groups, backward=groups) for r, groups in enumerate(
        tuple(tuple(Slice(i, 0, len(rows[i]["input_ids"])) for i in group) for group in spec) for spec in replicas))
    ids = sorted(i for spec in replicas for group in spec for i in group)
    return Plan(config=config, strategy="hand", samples=tuple(Sample(id=i, length=len(rows[i]["input_ids"])) for i in ids),
                pipelines=pipes)


@pytest.mark.distributed
def test_ddp_training_with_padding_micro_batches_equals_unpacked_training(config):
    rows = token_rows(LENGTHS, seed=3)
    lr = 0.5
    plans = [
        # step 0: rank 1 holds one long document against rank 0's three micro-batches: 2 padding rows,
        # the last one run outside no_sync (it carries rank 1's gradient all-reduce)
        _hand_plan(config, [[[0], [1], [2]], [[3]]], rows),
        # step 1: rank 0's one micro-batch of two samples, then 2 padding rows
        _hand_plan(config, [[[4, 5]], [[6], [7], [8]]], rows),
    ]
    results = spawn(train_hand_plans, 2, (rows, plans, lr), timeout_s=240)
    assert results[0]["micro_batches"] == [3, 3]
    step_samples = [[rows[s.id]["input_ids"] for s in plan.samples] for plan in plans]
    _assert_trains_as_unpacked(results, step_samples, lr, padding_rows=4)
