"""Global-batch sampler: budget, chunking, drop accounting and determinism, by property tests
against a naive reference written from the module docstring's rules."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slimpack.config import TrainConfig
from slimpack.data import (
    Batch,
    Dataset,
    GlobalBatchSampler,
    SamplerConfig,
    context_cut,
    load_dataset,
    sample_batches,
)
from slimpack.errors import UserError


def reference_batches(lengths, config: SamplerConfig, num_steps: int):
    """Plain-Python reading of the rules: stream of (length, doc, chunk, epoch), greedy fill."""

    def stream():
        epoch = 0
        while True:
            order = (np.random.default_rng([config.seed, epoch]).permutation(len(lengths))
                     if config.shuffle else range(len(lengths)))
            for doc in order:
                length = int(lengths[doc])
                if length > config.max_context and config.drop_long:
                    continue
                for chunk, start in enumerate(range(0, length, config.max_context)):
                    yield (min(config.max_context, length - start), int(doc), chunk, epoch)
            epoch += 1

    items, out, current = stream(), [], []
    pending = next(items)
    while len(out) < num_steps:
        if sum(item[0] for item in current) + pending[0] > config.global_batch_tokens:
            out.append(current)
            current = []
        else:
            current.append(pending)
            pending = next(items)
    return out


lengths_strategy = st.lists(st.integers(1, 300), min_size=1, max_size=40)
config_strategy = st.builds(
    lambda budget, context_share, shuffle, seed, drop: SamplerConfig(
        global_batch_tokens=budget, max_context=max(1, budget * context_share // 100),
        shuffle=shuffle, seed=seed, drop_long=drop),
    st.integers(1, 400), st.integers(1, 100), st.booleans(), st.integers(0, 5), st.booleans())


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_strategy, config=config_strategy, num_steps=st.integers(1, 25))
def test_matches_reference_and_keeps_invariants(lengths, config, num_steps):
    lengths = np.array(lengths)
    if config.drop_long and (lengths > config.max_context).all():
        with pytest.raises(UserError, match="nothing to sample"):
            GlobalBatchSampler(lengths, config)
        return
    sampler = GlobalBatchSampler(lengths, config)
    batches = sampler.batches(num_steps)
    expected = reference_batches(lengths, config, num_steps)
    assert [[(s.length, s.doc_index, s.chunk, s.epoch) for s in b.samples] for b in batches] == expected

    for step, batch in enumerate(batches):
        assert batch.step == step and batch.samples
        assert [s.id for s in batch.samples] == list(range(len(batch.samples)))
        assert batch.num_tokens <= config.global_batch_tokens
        assert all(1 <= s.length <= config.max_context for s in batch.samples)
        if step + 1 < len(batches):  # full: the next sample would not have fitted
            assert batch.num_tokens + batches[step + 1].samples[0].length > config.global_batch_tokens

    # Tokens conserved: the chunks of each (epoch, document) seen whole rebuild its length.
    chunks = defaultdict(list)
    for batch in batches:
        for s in batch.samples:
            chunks[(s.epoch, s.doc_index)].append((s.chunk, s.length))
    last = batches[-1].samples[-1]
    for (epoch, doc), parts in chunks.items():
        assert [c for c, _ in parts] == list(range(len(parts)))  # consecutive, in order
        assert all(n == config.max_context for _, n in parts[:-1])
        if (epoch, doc) != (last.epoch, last.doc_index):  # the last one may continue next step
            assert sum(n for _, n in parts) == lengths[doc]
        if config.drop_long:
            assert lengths[doc] <= config.max_context

    # Every completed epoch visits each kept document exactly once.
    for epoch in range(last.epoch):
        docs = sorted(doc for (e, doc) in chunks if e == epoch)
        kept = [d for d in range(len(lengths)) if not (config.drop_long and lengths[d] > config.max_context)]
        assert docs == kept

    # Drop accounting: per-batch counts add up, and match a count over the visited prefix.
    long_docs = lengths > config.max_context
    assert sampler.num_long_docs == int(long_docs.sum())
    assert sampler.num_dropped_docs == (int(long_docs.sum()) if config.drop_long else 0)
    assert sampler.num_dropped_tokens == (int(lengths[long_docs].sum()) if config.drop_long else 0)
    docs, tokens = sampler.dropped_through(num_steps - 1)
    assert docs == sum(b.num_dropped_docs for b in batches)
    assert tokens == sum(b.num_dropped_tokens for b in batches)
    if config.drop_long and not config.shuffle:
        prefix = lengths[: last.doc_index + 1]
        assert docs == last.epoch * sampler.num_dropped_docs + int((prefix > config.max_context).sum())
        assert tokens == last.epoch * sampler.num_dropped_tokens + int(prefix[prefix > config.max_context].sum())
    if not config.drop_long:
        assert (docs, tokens) == (0, 0)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, configs=st.lists(config_strategy, min_size=2, max_size=3), num_steps=st.integers(1, 12))
def test_samplers_of_one_dataset_under_other_settings_keep_their_own_batches(lengths, configs, num_steps):
    """Samplers of one dataset share the epochs they build (``_epochs``): interleaved, each one's
    batches still follow its own settings."""
    dataset = Dataset(name="shared", lengths=np.array(lengths), source="test")
    configs = [c for c in configs if not (c.drop_long and (dataset.lengths > c.max_context).all())]
    samplers = [GlobalBatchSampler(dataset, c) for c in configs]
    for step in [*range(num_steps), *reversed(range(num_steps))]:
        for sampler, config in zip(samplers, configs, strict=True):
            got = [(s.length, s.doc_index, s.chunk, s.epoch) for s in sampler.batch_at(step).samples]
            assert got == reference_batches(dataset.lengths, config, step + 1)[step]


@settings(max_examples=40, deadline=None)
@given(lengths=lengths_strategy, config=config_strategy, steps=st.lists(st.integers(0, 30), min_size=1, max_size=5))
def test_batch_at_is_reproducible_in_any_order(lengths, config, steps):
    config = SamplerConfig(**{**config.to_dict(), "drop_long": False})
    first = GlobalBatchSampler(np.array(lengths), config)
    forward = {step: first.batch_at(step) for step in sorted(steps)}
    for step in reversed(steps):  # a fresh sampler, asked in another order
        assert GlobalBatchSampler(np.array(lengths), config).batch_at(step) == forward[step]
        assert first.batch_at(step) == forward[step]


def test_hand_example_chunking_and_budget():
    config = SamplerConfig(global_batch_tokens=10, max_context=4)
    batches = GlobalBatchSampler(np.array([3, 9, 2, 5]), config).batches(4)
    # Stream: 3 | 4 4 1 | 2 | 4 1, then the next epoch.
    assert [b.lengths for b in batches] == [(3, 4), (4, 1, 2), (4, 1, 3), (4, 4, 1)]
    assert [(s.doc_index, s.chunk) for s in batches[0].samples] == [(0, 0), (1, 0)]
    # Step 2 wraps into the second epoch: doc 3's two chunks, then doc 0 again.
    assert [(s.doc_index, s.chunk, s.epoch) for s in batches[2].samples] == [(3, 0, 0), (3, 1, 0), (0, 0, 1)]

    dropped = GlobalBatchSampler(np.array([3, 9, 2, 5]), SamplerConfig(
        global_batch_tokens=10, max_context=4, drop_long=True)).batches(2)
    # Stream: 3 2 | 3 2 | ... (docs 1 and 3 skipped). Batch 0 ends on epoch 1's doc 2, after the
    # skips of doc 1 (epoch 0), doc 3 (epoch 0) and doc 1 (epoch 1): 3 docs, 9 + 5 + 9 tokens.
    assert [b.lengths for b in dropped] == [(3, 2, 3, 2), (3, 2, 3, 2)]
    assert [(b.num_dropped_docs, b.num_dropped_tokens) for b in dropped] == [(3, 23), (4, 28)]


def test_shuffle_is_a_fixed_permutation_per_epoch():
    lengths = np.arange(1, 101)
    config = SamplerConfig(global_batch_tokens=10_000, max_context=100, shuffle=True, seed=3)
    first = GlobalBatchSampler(lengths, config).batch_at(0)
    epochs = defaultdict(list)
    for s in first.samples:
        epochs[s.epoch].append(s.doc_index)
    assert sorted(epochs[0]) == list(range(100))  # one whole epoch fits in the budget (5050)
    assert epochs[0] != sorted(epochs[0]) and epochs[0] != epochs[1][: len(epochs[0])]
    other = GlobalBatchSampler(lengths, SamplerConfig(**{**config.to_dict(), "seed": 4})).batch_at(0)
    assert other != first


def test_real_dataset_steps_are_cheap_and_stable():
    dataset = load_dataset("textbooks")
    config = SamplerConfig(global_batch_tokens=1 << 20, max_context=64 << 10, shuffle=True, seed=1)
    late = GlobalBatchSampler(dataset, config).batch_at(2000)  # several epochs in
    assert late.samples[0].epoch >= 8 and 0.9 * (1 << 20) < late.num_tokens <= 1 << 20
    assert sample_batches(dataset, config, 1, start=2000) == [late]
    assert isinstance(sample_batches("pydocs", config, 1)[0], Batch)


def test_config_validation_and_from_train():
    with pytest.raises(UserError, match=r"max_context \(8\) must be <= global_batch_tokens \(4\)"):
        SamplerConfig(global_batch_tokens=4, max_context=8)
    with pytest.raises(UserError, match="global_batch_tokens must be a positive integer"):
        SamplerConfig(global_batch_tokens=0)
    with pytest.raises(UserError, match="seed must be a non-negative integer"):
        SamplerConfig(seed=-1)
    config = SamplerConfig.from_train(TrainConfig(max_context=1024, global_batch_tokens=8192, seed=5),
                                      shuffle=True)
    assert (config.max_context, config.global_batch_tokens, config.seed, config.shuffle) == (1024, 8192, 5, True)
    assert SamplerConfig.from_dict(config.to_dict()) == config
    sampler = GlobalBatchSampler(np.array([5]), SamplerConfig(global_batch_tokens=8, max_context=8))
    with pytest.raises(UserError, match="step must be a non-negative integer"):
        sampler.batch_at(-1)


def test_an_epoch_of_more_samples_than_the_sampler_holds_is_refused():
    from slimpack.data.sampler import MAX_EPOCH_SAMPLES

    # two documents of 2**25 + 1 tokens: 2**26 + 2 one-token samples at context 1 (one over the
    # limit each), refused before any array of that size is made; one token less each fits exactly
    lengths = np.full(2, 2**25 + 1)
    with pytest.raises(UserError, match=r"makes 67,108,866 samples per epoch at max_context 1 .*"
                                        r"more than the 67,108,864 the sampler holds: raise max_context"):
        GlobalBatchSampler(lengths, SamplerConfig(global_batch_tokens=8, max_context=1))
    assert GlobalBatchSampler(lengths - 1, SamplerConfig(global_batch_tokens=8, max_context=1)
                              ).samples_per_epoch == MAX_EPOCH_SAMPLES


def test_a_batch_of_more_samples_than_a_plan_may_hold_is_refused():
    from slimpack.data.sampler import MAX_BATCH_SAMPLES

    # one-token samples: a budget of 2**20 tokens holds exactly the most a batch may, one more does not
    sampler = GlobalBatchSampler(np.full(3, 2**20), SamplerConfig(global_batch_tokens=2**20 + 1, max_context=1))
    with pytest.raises(UserError, match=r"the batch of step 0 holds 1,048,577 samples \(1,048,577 tokens at "
                                        r"max_context 1\), more than the 1,048,576 a plan may hold"):
        sampler.batch_at(0)
    sampler = GlobalBatchSampler(np.full(3, 2**20), SamplerConfig(global_batch_tokens=2**20, max_context=1))
    assert sampler.start(1) == (0, MAX_BATCH_SAMPLES)  # the step's span, found without building the batch


def test_a_batch_that_wraps_round_a_small_dataset_too_often_is_refused_before_sampling():
    # 3 documents of 10 tokens: 2**20 + 2 tokens pass through them 34,952 times, 104,856 samples or
    # more: allowed; 10x that is refused up front (the sampler walked the epochs one by one, and 1G
    # tokens did not end in a minute)
    lengths = np.full(3, 10)
    within = GlobalBatchSampler(lengths, SamplerConfig(global_batch_tokens=2**20 + 2, max_context=16))
    assert len(within.batch_at(0).samples) == (2**20 + 2) // 10
    with pytest.raises(UserError, match=r"a batch of 10,485,780 tokens runs 349,526 times or more through dataset "
                                        r"'.*' \(30 tokens, 3 samples\): at least 1,048,578 samples, more than the "
                                        r"1,048,576 a plan may hold"):
        GlobalBatchSampler(lengths, SamplerConfig(global_batch_tokens=10 * (2**20 + 2), max_context=16))


def test_step_accepts_numpy_integers_only():
    sampler = GlobalBatchSampler(np.array([5, 6]), SamplerConfig(global_batch_tokens=8, max_context=8))
    assert sampler.batch_at(np.int64(1)) == sampler.batch_at(1)
    with pytest.raises(UserError, match="step must be a non-negative integer, got 1.5"):
        sampler.batch_at(1.5)  # type: ignore[arg-type]


def test_a_restored_batch_start_needs_no_walk_and_gives_the_same_batches():
    lengths = np.arange(1, 400) * 37 % 5000 + 1
    config = SamplerConfig(global_batch_tokens=8192, max_context=4096, shuffle=True)
    walked = GlobalBatchSampler(lengths, config)
    expected = [walked.batch_at(step) for step in range(300, 303)]
    restored = GlobalBatchSampler(lengths, config)
    restored.set_start(300, walked.start(300))
    assert [restored.batch_at(step) for step in range(300, 303)] == expected
    assert sorted(restored._starts) == [0, 300, 301, 302, 303]  # nothing before step 300 was walked
    assert restored.batch_at(5) == walked.batch_at(5)  # earlier steps still walk from the start
    with pytest.raises(UserError, match="cannot start at stream position"):
        restored.set_start(10, (0, 10**9))


def test_samplers_over_the_same_data_share_a_batch_but_not_one_from_elsewhere_in_the_stream():
    lengths = np.arange(1, 400) * 37 % 5000 + 1
    data = Dataset(name="shared", lengths=lengths, source="test")
    config = SamplerConfig(global_batch_tokens=8192, max_context=4096)
    first, second = GlobalBatchSampler(data, config), GlobalBatchSampler(data, config)
    assert second.batch_at(3) is first.batch_at(3)  # made once: tune makes a sampler per trial
    moved = GlobalBatchSampler(data, config)
    moved.set_start(3, (0, first.start(3)[1] + 1))  # step 3 restored one sample later in the stream
    assert moved.batch_at(3) != first.batch_at(3)
    assert (moved.batch_at(3).samples[0].doc_index, moved.batch_at(3).samples[0].length) == \
        (first.batch_at(3).samples[1].doc_index, first.batch_at(3).samples[1].length)
    copy = GlobalBatchSampler(Dataset(name="copy", lengths=lengths.copy(), source="test"), config).batch_at(3)
    assert copy == first.batch_at(3) and copy is not first.batch_at(3)  # other data: made anew, equal here


def test_context_cut_counts_what_the_sampler_does():
    # 70000 -> 2 chunks of 64K (+1 sample), 200000 -> 4 chunks (+3); dropping instead skips both documents
    lengths = np.array([10, 70000, 40000, 200000])
    cut = context_cut(lengths, 65536)
    assert (cut.num_docs, cut.num_cut_docs, cut.num_extra_samples, cut.num_dropped_tokens) == (4, 2, 4, 0)
    assert "2 of 4 documents longer than the 65536-token context cut" in cut.describe()
    dropped = context_cut(lengths, 65536, drop_long=True)
    assert (dropped.num_extra_samples, dropped.num_dropped_tokens) == (0, 270000)
    assert "270,000 tokens not trained" in dropped.describe()
    for drop_long, samples, tokens in ((False, 8, 310010), (True, 2, 40010)):
        sampler = GlobalBatchSampler(lengths, SamplerConfig(global_batch_tokens=65536, max_context=65536,
                                                            drop_long=drop_long))
        assert (sampler.samples_per_epoch, sampler.tokens_per_epoch) == (samples, tokens)
        assert sampler.num_dropped_tokens == 310010 - tokens
