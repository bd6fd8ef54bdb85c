"""The step stream: run-wide ids, seeking without replay, deferral bookkeeping, drain, checkpoints."""

from __future__ import annotations

import pytest

from helpers import config
from slimpack.config import ParallelConfig, PlannerConfig, TrainConfig, build_config
from slimpack.data import GlobalBatchSampler, SamplerConfig, load_dataset
from slimpack.plan import plan_to_dict
from slimpack.strategies.stream import PlanStream


def _config():
    return config(pp=2, dp=2, model="tiny", max_context=4096, global_batch_tokens=16384)


def _wlbllm_config():
    """wlbllm at 64K context on tp 8 x pp 2 x dp 2: wlb defers outliers. The MILP is off: its result depends on
    how far the solver gets within a wall-clock limit, so two runs could differ."""
    return build_config(model="llama2-7b", parallel=ParallelConfig(tp=8, pp=2, dp=2),
                        train=TrainConfig(max_context=65536, global_batch_tokens=1 << 20),
                        planner=PlannerConfig(use_milp=False))


def _plan(planned) -> dict:
    return {k: v for k, v in plan_to_dict(planned.plan).items() if k != "info"}  # info holds wall times


def test_ids_are_stream_positions_and_seeking_a_stateless_strategy_skips_the_walk():
    data = load_dataset("wikipedia")
    walked = PlanStream(data, _config(), "kk")
    steps = [next(walked) for _ in range(6)]
    ids = [s.id for step in steps for s in step.plan.samples]
    assert ids == list(range(len(ids)))  # unique across the run, in stream order
    assert [s.arrival_step for s in steps[3].plan.samples] == [3] * len(steps[3].plan.samples)
    seeked = PlanStream(data, _config(), "kk", start=5)
    assert _plan(next(seeked)) == _plan(steps[5])
    assert seeked.step == 6


def test_samples_before_counts_every_epoch_alike():
    lengths = [5000, 300, 9000, 100, 4096]  # chunks at 4096: 2 + 1 + 3 + 1 + 1 = 8 samples per epoch
    for shuffle in (False, True):
        sampler = GlobalBatchSampler(lengths, SamplerConfig(global_batch_tokens=8192, max_context=4096,
                                                            shuffle=shuffle))
        assert sampler.samples_per_epoch == 8
        counted = 0
        for step in range(12):  # ~4 epochs
            assert sampler.samples_before(step) == counted
            counted += len(sampler.batch_at(step).samples)


def test_sources_cover_what_a_step_trains_including_what_was_deferred():
    # wlbllm at 64K context: wlb defers outliers and brings them back (at step 8 here) with their
    # arrival step
    cfg = config(pp=2, dp=2, model="llama2-7b", max_context=65536, global_batch_tokens=1 << 19)
    stream = PlanStream(load_dataset("wlbllm"), cfg, "wlb")
    seen = {}
    late = 0
    for _ in range(10):
        planned = next(stream)
        assert set(planned.sources) == {s.id for s in planned.trained}
        for sample in planned.trained:
            source = planned.sources[sample.id]
            assert source.length == sample.length
            seen[sample.id] = (source.doc_index, source.chunk)
            late += sample.arrival_step < planned.step
        assert stream.held_tokens == sum(planned.plan.sample_lengths()[i] for i in planned.plan.deferred)
    assert late > 0 and len(set(seen.values())) == len(seen)  # deferred ones came back, none twice
    while stream.held_tokens:
        drained = stream.drain()
        assert drained.drain and all(s.arrival_step < drained.step for s in drained.trained)


@pytest.mark.parametrize("strategy", ["wlb", "slimpack"])
def test_a_restored_state_gives_the_same_steps_as_walking(strategy):
    cfg = _wlbllm_config()
    data = load_dataset("wlbllm")
    walked = PlanStream(data, cfg, strategy)
    for _ in range(4):
        next(walked)
    state = walked.state_dict()
    expected = [next(walked) for _ in range(3)]
    restored = PlanStream(data, cfg, strategy)
    restored.load_state_dict(state)
    got = [next(restored) for _ in range(3)]
    assert [_plan(p) for p in got] == [_plan(p) for p in expected]
    assert [dict(p.sources) for p in got] == [dict(p.sources) for p in expected]
    if strategy == "wlb":
        assert state["held"] and state["planner"]["queues"] is not None


def test_seeking_a_stateful_strategy_replays_it():
    cfg = _wlbllm_config()
    data = load_dataset("wlbllm")
    walked = PlanStream(data, cfg, "wlb")
    expected = [next(walked) for _ in range(3)][-1]
    assert _plan(next(PlanStream(data, cfg, "wlb", start=2))) == _plan(expected)
    back = PlanStream(data, cfg, "wlb", start=3)
    back.seek(2)  # backwards: from step 0 again
    assert _plan(next(back)) == _plan(expected)


def test_a_state_for_another_strategy_is_refused():
    stream = PlanStream(load_dataset("wikipedia"), _config(), "kk")
    with pytest.raises(Exception, match="not a version-1 state for strategy 'kk'"):
        stream.load_state_dict(PlanStream(load_dataset("wikipedia"), _config(), "bfd").state_dict())


def test_trained_documents_are_whole_even_when_a_strategy_cuts_them():
    data = load_dataset("wikipedia")
    fixed = next(PlanStream(data, _config(), "fixed", start=2))
    batch = PlanStream(data, _config(), "kk").batch(2)
    assert sorted(fixed.trained_document_lengths) == sorted(s.length for s, _ in batch.values())
    assert len(fixed.trained) > len(batch)  # fixed cut some documents at sequence boundaries
    assert fixed.trained_tokens == sum(fixed.trained_document_lengths)


def test_seeking_slimpack_replays_only_from_its_last_full_search(monkeypatch):
    # SlimPack's search seed is replaced by a full search every `resets_every` steps: a stream that
    # seeks to step 6 plans steps 4 and 5 only (period 4 here), and its step 6 equals the walked one.
    from slimpack.strategies.slimpack import planner as slimpack_planner

    monkeypatch.setattr(slimpack_planner.SlimPackPlanner, "resets_every", 4)
    monkeypatch.setattr(slimpack_planner, "FULL_SEARCH_EVERY", 4)
    cfg, data = _config(), load_dataset("wikipedia")
    walked = PlanStream(data, cfg, "slimpack")
    expected = [next(walked) for _ in range(7)][-1]
    planned_steps: list[int] = []
    sought = PlanStream(data, cfg, "slimpack")
    original = sought.planner.__class__.plan
    monkeypatch.setattr(slimpack_planner.SlimPackPlanner, "plan",
                        lambda self, batch, *, step: planned_steps.append(step) or original(self, batch, step=step))
    sought.seek(6)
    assert planned_steps == [4, 5]
    assert _plan(next(sought)) == _plan(expected)


def test_a_batch_that_cannot_be_made_fails_its_step_and_the_stream_moves_on():
    import numpy as np

    from slimpack.data import Dataset
    from slimpack.errors import UserError

    # one-token samples, one more per batch than a plan may hold (the sampler refuses the batch):
    # without moving on, a comparison would ask for step 0 forever
    lengths = np.full(3, 2**20)
    stream = PlanStream(Dataset(name="ones", lengths=lengths, source="test"),
                        config(pp=2, dp=2, model="tiny", max_context=1, global_batch_tokens=2**20 + 1), "fixed")
    for step in (0, 1):
        with pytest.raises(UserError, match=f"the batch of step {step} holds 1,048,577 samples"):
            next(stream)
        assert stream.step == step + 1
