"""The executor reproduces the unsliced, unpacked reference: loss and every parameter gradient, for
random slicings, packings, asymmetric backward groupings, action orders and stage counts."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from runtime_plans import pipelines, random_actions

from slimpack.config import model_preset
from slimpack.plan.types import Action, PipelinePlan, Slice
from slimpack.runtime import (
    ScheduleError,
    StageExecutor,
    build_executors,
    build_model,
    count_loss_tokens,
    random_tokens,
    reference_loss,
    run_in_order,
    run_stage_orders,
)
from slimpack.runtime.verify import gradient_errors

TINY = model_preset("tiny")


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def compare(pipe: PipelinePlan, lengths: dict[int, int], *, num_stages: int, dtype: torch.dtype,
            actions: list[Action] | None = None, model=TINY, seed: int = 0,
            backend: str = "math") -> tuple[float, float]:
    """(relative loss error, max over parameters of max|g − g_ref| / max|g_ref|, as verify reports it)."""
    tokens = random_tokens(lengths, model.vocab_size, seed)
    num_loss = count_loss_tokens(lengths.values())
    net = build_model(model, seed=seed, dtype=dtype)
    executors = build_executors(net, pipe, num_chunks=num_stages, sample_lengths=lengths, tokens=tokens,
                                num_loss_tokens=num_loss, backend=backend)
    if actions is None:
        actions = random_actions(pipe, random.Random(0))
    loss = run_in_order(executors, actions)
    assert all(e.finished for e in executors)
    grads = {n: _grad(p).clone() for n, p in net.named_parameters()}
    net.zero_grad(set_to_none=True)
    ref = reference_loss(net, tokens, num_loss_tokens=num_loss)
    worst = max(e.relative for e in gradient_errors(grads, {n: _grad(p) for n, p in net.named_parameters()}))
    loss_err = abs(loss.item() - ref.item()) / max(abs(ref.item()), 1e-30)
    return loss_err, worst


@settings(settings.get_profile("runtime"))
@given(case=pipelines(), stages=st.sampled_from([1, 2, 4]), order_seed=st.integers(0, 2**16),
       backend=st.sampled_from(["math", "cpu"]))
def test_random_plans_match_reference_float64(case, stages, order_seed, backend) -> None:
    pipe, lengths = case
    actions = random_actions(pipe, random.Random(order_seed))
    loss_err, grad_err = compare(pipe, lengths, num_stages=stages, dtype=torch.float64, actions=actions,
                                 backend=backend)
    assert loss_err < 1e-10
    assert grad_err < 1e-10


@settings(settings.get_profile("runtime"), max_examples=15)
@given(case=pipelines(max_length=200), stages=st.sampled_from([1, 2]), backend=st.sampled_from(["math", "cpu"]))
def test_random_plans_match_reference_float32(case, stages, backend) -> None:
    pipe, lengths = case
    # with no sample longer than 2 tokens the Q/K gradients are 0 in exact arithmetic: roundoff only
    assume(max(lengths.values()) > 2)
    loss_err, grad_err = compare(pipe, lengths, num_stages=stages, dtype=torch.float32, backend=backend)
    assert loss_err < 1e-5
    assert grad_err < 1e-5


S = Slice
# Sample 0 (41 tokens) in three slices; 1 in two; 2 whole. Forward groups mix them; backward groups
# regroup: the first backward group takes slices from two forward groups, and forward group 1 is
# split over two backward groups.
LENGTHS = {0: 41, 1: 20, 2: 5}
FORWARD = ((S(0, 0, 10), S(1, 0, 7)), (S(0, 10, 30), S(2, 0, 5)), (S(0, 30, 41), S(1, 7, 20)))
BACKWARD = ((S(1, 7, 20), S(0, 30, 41), S(0, 10, 30)), (S(2, 0, 5),), (S(0, 0, 10), S(1, 0, 7)))
ASYMMETRIC = PipelinePlan(replicas=(0,), cp=1, forward=FORWARD, backward=BACKWARD)


@pytest.mark.parametrize("variant", [
    {}, {"ffn_kind": "gelu"}, {"tie_embeddings": True}, {"num_kv_heads": 4}, {"num_kv_heads": 1},
])
def test_model_variants_match_reference(variant) -> None:
    model = dataclasses.replace(TINY, **variant)
    loss_err, grad_err = compare(ASYMMETRIC, LENGTHS, num_stages=2, dtype=torch.float64, model=model)
    assert loss_err < 1e-12 and grad_err < 1e-10


def test_per_stage_orders_run_like_a_pipeline() -> None:
    net = build_model(TINY)
    tokens = random_tokens(LENGTHS, TINY.vocab_size)
    num_loss = count_loss_tokens(LENGTHS.values())
    # 1F1B-like: stage 0 runs ahead by one forward; backward groups interleave as soon as they can.
    order = (("F0", "F1", "F2", "B0", "B1", "B2"), ("F0", "F1", "F2", "B0", "B1", "B2"))
    executors = build_executors(net, ASYMMETRIC, num_chunks=2, sample_lengths=LENGTHS, tokens=tokens,
                                num_loss_tokens=num_loss)
    loss = run_stage_orders(executors, order)
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    net.zero_grad(set_to_none=True)
    ref = reference_loss(net, tokens)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    for name, p in net.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-10, atol=1e-12)


def test_interleaved_chunks_run_in_stage_order() -> None:
    """pp=2 with 2 virtual stages: chunk c of stage s is model chunk 2c+s."""
    net = build_model(TINY)
    tokens = random_tokens(LENGTHS, TINY.vocab_size)
    executors = build_executors(net, ASYMMETRIC, num_chunks=4, sample_lengths=LENGTHS, tokens=tokens,
                                num_loss_tokens=count_loss_tokens(LENGTHS.values()), stages_per_pipeline=2)
    per_stage = [Action("F", g, c) for g in range(3) for c in (0, 1)] + [
        Action("B", g, c) for g in range(3) for c in (1, 0)]
    loss = run_stage_orders(executors, [per_stage, per_stage])
    assert loss.item() == pytest.approx(reference_loss(build_model(TINY), tokens, backward=False).item(), rel=1e-12)
    assert [e.name for e in executors] == ["stage 0 chunk 0", "stage 1 chunk 0", "stage 0 chunk 1", "stage 1 chunk 1"]


def test_deadlocking_order_is_reported() -> None:
    net = build_model(TINY)
    tokens = random_tokens(LENGTHS, TINY.vocab_size)
    executors = build_executors(net, ASYMMETRIC, num_chunks=2, sample_lengths=LENGTHS, tokens=tokens,
                                num_loss_tokens=count_loss_tokens(LENGTHS.values()))
    order = (("F0", "F1", "B0", "F2", "B1", "B2"), ("F0", "F1", "F2", "B0", "B1", "B2"))
    with pytest.raises(ScheduleError, match=r"deadlocks: stage 0 at B0"):
        run_stage_orders(executors, order)


def _single_stage(pipe: PipelinePlan = ASYMMETRIC, lengths: dict[int, int] = LENGTHS) -> StageExecutor:
    net = build_model(TINY)
    return StageExecutor(net.stage(0, TINY.num_layers), pipe.forward, pipe.backward, sample_lengths=lengths,
                         tokens=random_tokens(lengths, TINY.vocab_size))


def test_forward_before_earlier_slice_is_an_error() -> None:
    executor = _single_stage()
    with pytest.raises(ScheduleError, match=r"F1 on stage: slice \(0, 10, 30\) needs the forward of earlier "
                                            r"slice \(0, 0, 10\) \(F0\) first"):
        executor.forward(1)


def test_backward_before_forward_is_an_error() -> None:
    executor = _single_stage()
    executor.forward(0)
    executor.forward(1)
    with pytest.raises(ScheduleError, match=r"B0 on stage: slice \(1, 7, 20\) has not run its forward \(F2\)"):
        executor.backward(0)


def test_backward_before_later_slice_is_an_error() -> None:
    executor = _single_stage()
    for g in range(3):
        executor.forward(g)
    with pytest.raises(ScheduleError, match=r"B2 on stage: slice \(0, 0, 10\) needs the backward of later "
                                            r"slice \(0, 10, 30\) \(B0\) first"):
        executor.backward(2)


def test_actions_run_twice_are_errors() -> None:
    executor = _single_stage()
    executor.forward(0)
    with pytest.raises(ScheduleError, match="already run its forward"):
        executor.forward(0)
    for g in (1, 2):
        executor.forward(g)
    executor.backward(0)
    with pytest.raises(ScheduleError, match="already run its backward"):
        executor.backward(0)


def test_groups_must_tile_the_samples_and_agree() -> None:
    net = build_model(TINY)
    stage = net.stage(0, 4)
    tokens = random_tokens({0: 10}, TINY.vocab_size)
    with pytest.raises(ValueError, match="gap at 4"):
        StageExecutor(stage, [[S(0, 0, 4), S(0, 5, 10)]], [[S(0, 0, 4), S(0, 5, 10)]],
                      sample_lengths={0: 10}, tokens=tokens)
    with pytest.raises(ValueError, match="do not hold the same slices"):
        StageExecutor(stage, [[S(0, 0, 10)]], [[S(0, 0, 5), S(0, 5, 10)]], sample_lengths={0: 10}, tokens=tokens)
    with pytest.raises(ValueError, match="no order can run them"):
        StageExecutor(stage, [[S(0, 0, 3), S(0, 6, 10)], [S(0, 3, 6)]], [[S(0, 3, 6)], [S(0, 6, 10), S(0, 0, 3)]],
                      sample_lengths={0: 10}, tokens=tokens)


def test_stage_inputs_are_checked() -> None:
    net = build_model(TINY)
    tokens = random_tokens(LENGTHS, TINY.vocab_size)
    first, second = (StageExecutor(st_, FORWARD, BACKWARD, sample_lengths=LENGTHS, tokens=tokens)
                     for st_ in net.split(2))
    with pytest.raises(ValueError, match=r"expected an input of shape \(17, 64\), got None"):
        second.forward(0)
    for g in range(len(FORWARD)):
        out = first.forward(g)
        assert out.shape == (sum(s.tokens for s in FORWARD[g]), 64)
        second.forward(g, out)
    with pytest.raises(ValueError, match="takes no output gradient"):
        second.backward(0, torch.zeros(44, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"expected an output gradient of shape \(44, 64\), got None"):
        first.backward(0)


def test_changing_one_document_leaves_the_others_unchanged() -> None:
    """Packing never lets attention cross samples: rewriting sample 0's tokens changes no output row
    of samples 1 and 2, at any stage boundary, bit for bit."""
    net = build_model(TINY)
    tokens = random_tokens(LENGTHS, TINY.vocab_size)
    changed = {**tokens, 0: (tokens[0] + 1) % TINY.vocab_size}

    def outputs(toks):
        stages = [StageExecutor(s, FORWARD, BACKWARD, sample_lengths=LENGTHS, tokens=toks) for s in net.split(2)]
        rows = []
        for g in range(len(FORWARD)):
            mid = stages[0].forward(g)
            rows.append((mid, stages[1].forward(g, mid)))
        return rows

    for g, ((mid_a, loss_a), (mid_b, loss_b)) in enumerate(zip(outputs(tokens), outputs(changed), strict=True)):
        row = 0
        for s in FORWARD[g]:
            span = slice(row, row + s.tokens)
            row += s.tokens
            if s.sample_id == 0:
                assert not torch.equal(mid_a[span], mid_b[span])
            else:
                assert torch.equal(mid_a[span], mid_b[span]) and torch.equal(loss_a[span], loss_b[span])


def test_an_order_that_skips_a_backward_is_reported() -> None:
    net = build_model(TINY)
    tokens = random_tokens(LENGTHS, TINY.vocab_size)
    executors = build_executors(net, ASYMMETRIC, num_chunks=2, sample_lengths=LENGTHS, tokens=tokens,
                                num_loss_tokens=count_loss_tokens(LENGTHS.values()))
    order = (("F0", "F1", "F2", "B0", "B1"), ("F0", "F1", "F2", "B0", "B1"))
    with pytest.raises(ScheduleError, match=r"leaves 2 slice\(s\) without backward on stage 0"):
        run_stage_orders(executors, order)
