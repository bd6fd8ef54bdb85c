"""Padding-free batches for Hugging Face: the collator's format, every rank's micro-batches, and a
tiny LlamaForCausalLM trained with DDP on 2 gloo processes equal to unpacked training."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_workers import MAX_CONTEXT, hf_llama_config, token_rows, train_packed, train_unpacked  # noqa: E402

from slimpack.config import ParallelConfig, TrainConfig, build_config, resolve_model  # noqa: E402
from slimpack.data import Dataset, GlobalBatchSampler, SamplerConfig  # noqa: E402
from slimpack.errors import UserError  # noqa: E402
from slimpack.integrations.hf import PlanBatchSampler, packed_batch, plan_data_loader  # noqa: E402
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


def _sliced_plan(config, second_replica: tuple[int, ...] = (2, 3)) -> Plan:
    """Replica 0: sample 0 in two slices (groups [0a], [0b, 1]); replica 1: one group of whole samples."""
    lengths = {0: 100, 1: 30, 2: 40, 3: 20}
    s = [Slice(0, 0, 64), Slice(0, 64, 100), Slice(1, 0, 30)]
    first = PipelinePlan(replicas=(0,), cp=1, forward=((s[0],), (s[1], s[2])), backward=((s[0],), (s[1], s[2])))
    group = tuple(Slice(i, 0, lengths[i]) for i in second_replica)
    second = PipelinePlan(replicas=(1,), cp=1, forward=(group,), backward=(group,))
    samples = tuple(Sample(id=i, length=lengths[i]) for i in (0, 1, *second_replica))
    return Plan(config=config, strategy="hand", samples=samples, pipelines=(first, second))


class _Step:
    def __init__(self, plan):
        from types import SimpleNamespace

        self.plan = plan
        self.sources = {s.id: SimpleNamespace(doc_index=s.id, chunk=0, length=s.length) for s in plan.samples}


def test_sliced_plans_are_refused_or_lowered(config):
    step = _Step(_sliced_plan(config))
    with pytest.raises(UserError, match="has slices or asymmetric backward groups"):
        PlanBatchSampler([step], rank=0, max_context=MAX_CONTEXT)
    lowered = [PlanBatchSampler([step], rank=r, max_context=MAX_CONTEXT, lower=True) for r in (0, 1)]
    # sample 0 runs whole where its first slice was; replica 1's one micro-batch is cut in two
    # (40 of its 60 tokens reach half) so that both replicas run 2 micro-batches
    assert list(lowered[0]) == [[(0, 0, 100)], [(1, 0, 30)]]
    assert list(lowered[1]) == [[(2, 0, 40)], [(3, 0, 20)]]
    assert lowered[0].loss_tokens(0) == 99 + 29 + 39 + 19
    # replica 1 holding one sample: both replicas run one micro-batch (replica 0's two are merged)
    single = [PlanBatchSampler([_Step(_sliced_plan(config, (2,)))], rank=r, max_context=MAX_CONTEXT, lower=True)
              for r in (0, 1)]
    assert list(single[0]) == [[(0, 0, 100), (1, 0, 30)]] and list(single[1]) == [[(2, 0, 40)]]


@pytest.mark.distributed
def test_ddp_training_from_packed_batches_equals_unpacked_training(config):
    rows = token_rows(LENGTHS, seed=2)
    steps, lr = 3, 0.5
    # kk: several micro-batches per rank (slimpack packs this small batch into one per rank at
    # pp = 1), so gradient accumulation under DDP's no_sync is exercised too
    results = spawn(train_packed, 2, (rows, config, steps, lr, "kk"), timeout_s=240)
    sampler = GlobalBatchSampler(Dataset(name="t", lengths=LENGTHS, source="t"),
                                 SamplerConfig(global_batch_tokens=BATCH_TOKENS, max_context=MAX_CONTEXT))
    step_samples = [[rows[s.doc_index]["input_ids"][s.chunk * MAX_CONTEXT:][:s.length]
                     for s in sampler.batch_at(step).samples] for step in range(steps)]
    reference = train_unpacked(step_samples, lr)
    assert results[0]["micro_batches"] == results[1]["micro_batches"]
    assert sum(results[0]["micro_batches"]) > steps  # really packed into several micro-batches
    for got in results:
        assert got["losses"] == pytest.approx(reference["losses"], rel=1e-12)
        for name, grad in reference["first_grads"].items():
            scale = float(grad.abs().max()) + 1e-30
            assert float((got["first_grads"][name] - grad).abs().max()) / scale < 1e-10, name
        for name, param in reference["params"].items():
            assert torch.allclose(got["params"][name], param, rtol=0, atol=1e-12), name
    # both ranks together trained each sample of the three steps exactly once
    trained = sorted(results[0]["sample_lengths"] + results[1]["sample_lengths"])
    assert trained == sorted(len(s) for step in step_samples for s in step)
