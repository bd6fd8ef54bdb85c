"""``TrainConfig.cut_documents``: the stream cuts each batch where fixed-length sequences end, so every
strategy trains the pieces ``fixed`` and SlimPipe make; the pieces tile the documents' tokens, their
ids stay unique and seek-proof, and checkpoints keep a held piece's place in its document."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import config
from slimpack.data import GlobalBatchSampler, SamplerConfig, load_dataset
from slimpack.plan import plan_to_dict
from slimpack.plan.check import check_plan
from slimpack.strategies.fixed import pack_fixed_length
from slimpack.strategies.stream import PlanStream, step_samples


def _cut(cfg):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, cut_documents=True))


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 700), min_size=1, max_size=40), context=st.integers(1, 300),
       batches=st.integers(1, 4), step=st.integers(0, 5))
def test_pieces_tile_each_sample_at_the_sequence_boundaries(lengths, context, batches, step):
    sampler = GlobalBatchSampler(lengths, SamplerConfig(global_batch_tokens=context * batches, max_context=context))
    whole = step_samples(sampler, step)
    cut = step_samples(sampler, step, cut_documents=True)
    # the pieces are fixed's, in stream order, and each lies inside one context-token sequence
    assert [s.length for s, _ in cut.values()] == [s.length for s in
                                                     pack_fixed_length([s for s, _ in whole.values()], context)[0]]
    ends = 0
    for sample, _ in cut.values():
        assert ends // context == (ends + sample.length - 1) // context
        ends += sample.length
    # each sample's pieces: ids 2p and 2p + 1, tiling its token range, in order
    for pid, (whole_sample, source) in whole.items():
        parts = [cut[i] for i in (2 * pid, 2 * pid + 1) if i in cut]
        assert parts and parts[0][0].id == 2 * pid
        assert all(piece.arrival_step == whole_sample.arrival_step for piece, _ in parts)
        begin, end = source.token_range(context)
        ranges = [src.token_range(context) for _, src in parts]
        assert ranges[0][0] == begin and ranges[-1][1] == end
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        assert all((src.doc_index, src.chunk, src.epoch) == (source.doc_index, source.chunk, source.epoch)
                   for _, src in parts)
    assert len(cut) == sum(1 for pid in whole for i in (2 * pid, 2 * pid + 1) if i in cut)


def test_every_strategy_trains_fixeds_pieces_and_fixed_cuts_no_more():
    cfg = _cut(config(pp=2, dp=2, model="tiny", max_context=4096, global_batch_tokens=16384))
    data = load_dataset("wikipedia")
    steps = {name: [next(stream) for _ in range(3)]
             for name in ("fixed", "slimpack", "slimpipe")
             for stream in [PlanStream(data, cfg, name)]}
    for name, planned in steps.items():
        for step in planned:
            check_plan(step.plan)
            assert step.pieces_cut_off == 0, name  # the stream made the pieces: nobody cuts further
            assert set(step.sources) == {s.id for s in step.trained}
    lengths = [sorted(s.length for s in step.trained) for step in steps["fixed"]]
    assert [sorted(s.length for s in step.trained) for step in steps["slimpack"]] == lengths
    uncut = [next(stream) for stream in [PlanStream(data, dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, cut_documents=False)), "fixed")] for _ in range(3)]
    assert [sorted(s.length for s in step.trained) for step in uncut] == lengths  # fixed's own cut
    assert any(step.pieces_cut_off for step in uncut)
    ids = [s.id for step in steps["slimpack"] for s in step.trained]
    assert len(ids) == len(set(ids))


def test_a_cut_stream_seeks_and_restores_held_pieces():
    # wlb at 64K context on wlbllm defers long samples; cut, some of what it holds are pieces
    cfg = _cut(config(pp=2, dp=2, model="llama2-7b", max_context=65536, global_batch_tokens=1 << 20))
    data = load_dataset("wlbllm")
    walked = PlanStream(data, cfg, "wlb")
    for _ in range(4):
        next(walked)
    state = walked.state_dict()
    assert state["data"]["cut_documents"] is True
    assert any(entry[7] > 0 for entry in state["held"])  # a held piece after its document's boundary
    expected = [next(walked) for _ in range(3)]
    restored = PlanStream(data, cfg, "wlb")
    restored.load_state_dict(state)
    got = [next(restored) for _ in range(3)]
    strip = [{k: v for k, v in plan_to_dict(p.plan).items() if k != "info"} for p in got]
    assert strip == [{k: v for k, v in plan_to_dict(p.plan).items() if k != "info"} for p in expected]
    assert [dict(p.sources) for p in got] == [dict(p.sources) for p in expected]
    uncut = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, cut_documents=False))
    with pytest.raises(Exception, match="stream state is for other data or batches"):
        PlanStream(data, uncut, "wlb").load_state_dict(state)


def test_a_state_written_before_offsets_loads_as_whole_chunks():
    cfg = config(pp=2, dp=2, model="llama2-7b", max_context=65536, global_batch_tokens=1 << 19)
    data = load_dataset("wlbllm")
    walked = PlanStream(data, cfg, "wlb")
    for _ in range(3):
        next(walked)
    state = walked.state_dict()
    assert state["held"] and all(entry[7] == 0 for entry in state["held"])
    old = dict(state, held=[entry[:7] for entry in state["held"]])
    restored = PlanStream(data, cfg, "wlb")
    restored.load_state_dict(old)
    assert restored.state_dict() == state


def test_the_pieces_text_is_their_documents_text():
    from slimpack.config import TrainConfig, build_config
    from slimpack.data.text import TextCorpus

    corpus = TextCorpus.stdlib(max_files=40)
    train = TrainConfig(max_context=1000, global_batch_tokens=4000)
    sampler = GlobalBatchSampler(corpus.dataset(), SamplerConfig.from_train(train))
    cut = 0
    for step in range(4):
        pieces = step_samples(sampler, step, cut_documents=True)
        for pid, (_, source) in step_samples(sampler, step).items():
            parts = [pieces[i][1] for i in (2 * pid, 2 * pid + 1) if i in pieces]
            cut += len(parts) - 1
            assert b"".join(corpus.sample_tokens(p, train.max_context) for p in parts) == \
                corpus.sample_tokens(source, train.max_context)
    assert cut > 0
    assert build_config(train=dataclasses.replace(train, cut_documents=True)).train.cut_documents
