"""Numerics and memory of the runtime on random plans: the figures in docs/runtime.md.

    PYTHONPATH=src python benchmarks/runtime_numerics.py [--plans 200] [--seed 0]

1. Gradient and loss errors of the executor vs the unsliced reference over random plans (random
   lengths ≤ 200, random slice boundaries, random forward groupings, random asymmetric backward
   groupings, random valid interleavings of the actions, 1/2/4 stages), per dtype and backend.
2. Kept activation bytes (saved tensors + K/V caches) vs ``CostModel.activation_bytes`` for the
   tiny model in float32 (recompute='none'), peak per stage.
"""

from __future__ import annotations

import argparse
import random

import torch

from slimpack.config import ParallelConfig, TrainConfig, build_config, model_preset
from slimpack.cost import CostModel
from slimpack.plan.types import Action, PipelinePlan, Slice
from slimpack.runtime import (
    build_executors,
    build_model,
    count_loss_tokens,
    random_tokens,
    reference_loss,
    run_in_order,
)
from slimpack.runtime.verify import gradient_errors


def random_pipeline(rng: random.Random) -> tuple[PipelinePlan, dict[int, int]]:
    lengths = {sid: rng.randint(1, 200) for sid in range(rng.randint(1, 5))}
    per_sample = {}
    for sid, length in lengths.items():
        cuts = sorted(rng.sample(range(1, length), min(length - 1, rng.randint(0, 4)))) if length > 1 else []
        bounds = [0, *cuts, length]
        per_sample[sid] = [Slice(sid, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]

    def grouped(order: dict[int, list[Slice]]) -> tuple[tuple[Slice, ...], ...]:
        tickets = [sid for sid, slices in order.items() for _ in slices]
        rng.shuffle(tickets)
        taken = dict.fromkeys(order, 0)
        groups, current = [], []
        for sid in tickets:
            current.append(order[sid][taken[sid]])
            taken[sid] += 1
            if rng.random() < 0.4:
                groups.append(tuple(current))
                current = []
        return tuple(groups + [tuple(current)] * bool(current))

    forward = grouped(per_sample)
    backward = grouped({sid: s[::-1] for sid, s in per_sample.items()}) if rng.random() < 0.7 else forward[::-1]
    return PipelinePlan(replicas=(0,), cp=1, forward=forward, backward=backward), lengths


def valid_actions(pipe: PipelinePlan, rng: random.Random) -> list[Action]:
    later = {s: {t for g in pipe.forward for t in g if t.sample_id == s.sample_id and t.start > s.start}
             for g in pipe.forward for s in g}
    done_f, done_b, actions, f, pending = set(), set(), [], 0, list(range(len(pipe.backward)))
    while pending:
        ready = [b for b in pending if all(s in done_f and later[s] <= done_b | set(pipe.backward[b])
                                           for s in pipe.backward[b])]
        if f < len(pipe.forward) and (not ready or rng.random() < 0.5):
            actions.append(Action("F", f))
            done_f.update(pipe.forward[f])
            f += 1
        else:
            b = rng.choice(ready)
            actions.append(Action("B", b))
            done_b.update(pipe.backward[b])
            pending.remove(b)
    return actions


def numerics(num_plans: int, seed: int) -> None:
    tiny = model_preset("tiny")
    print(f"{'dtype':8} {'backend':8} {'plans':>5} {'asym':>5} {'max loss err':>13} {'max grad err':>13} "
          f"{'median grad err':>16}")
    for dtype in (torch.float64, torch.float32):
        for backend in ("math", "cpu"):
            rng = random.Random(seed)
            loss_errs, grad_errs, asym = [], [], 0
            for _ in range(num_plans):
                pipe, lengths = random_pipeline(rng)
                if max(lengths.values()) <= 2:
                    continue  # Q/K gradients are exactly 0: nothing but roundoff to compare
                asym += not pipe.symmetric and pipe.backward != pipe.forward[::-1]
                tokens = random_tokens(lengths, tiny.vocab_size, seed)
                net = build_model(tiny, seed=seed, dtype=dtype)
                num_loss = count_loss_tokens(lengths.values())
                executors = build_executors(net, pipe, num_chunks=rng.choice([1, 2, 4]), sample_lengths=lengths,
                                            tokens=tokens, num_loss_tokens=num_loss, backend=backend)
                loss = run_in_order(executors, valid_actions(pipe, rng))
                grads = {n: p.grad.clone() for n, p in net.named_parameters()}
                net.zero_grad(set_to_none=True)
                ref = reference_loss(net, tokens, num_loss_tokens=num_loss)
                ref_grads = {n: p.grad for n, p in net.named_parameters()}
                loss_errs.append(abs(loss.item() - ref.item()) / abs(ref.item()))
                grad_errs.append(max(e.relative for e in gradient_errors(grads, ref_grads)))
            grad_errs.sort()
            print(f"{str(dtype)[6:]:8} {backend:8} {len(grad_errs):5} {asym:5} {max(loss_errs):13.2e} "
                  f"{grad_errs[-1]:13.2e} {grad_errs[len(grad_errs) // 2]:16.2e}")


def memory() -> None:
    s = Slice
    lengths = {0: 96, 1: 40, 2: 24, 3: 60}
    forward = ((s(0, 0, 32), s(1, 0, 40)), (s(0, 32, 64), s(2, 0, 24), s(3, 0, 30)), (s(0, 64, 96), s(3, 30, 60)))
    backward = ((s(0, 64, 96),), (s(3, 30, 60), s(0, 32, 64), s(2, 0, 24)), (s(3, 0, 30), s(0, 0, 32), s(1, 0, 40)))
    pipe = PipelinePlan(replicas=(0,), cp=1, forward=forward, backward=backward)
    print(f"\n{'pp':>3} {'stage':>5} {'measured peak B':>16} {'model peak B':>13} {'ratio':>7}")
    for pp in (1, 2, 4):
        config = build_config(model="tiny", parallel=ParallelConfig(pp=pp), train=TrainConfig(recompute="none"))
        cost = CostModel(config)
        net = build_model(config.model, dtype=torch.float32)
        executors = build_executors(net, pipe, num_chunks=pp, sample_lengths=lengths,
                                    tokens=random_tokens(lengths, config.model.vocab_size),
                                    num_loss_tokens=count_loss_tokens(lengths.values()), track_memory=True)
        run_in_order(executors, [Action("F", g) for g in range(3)] + [Action("B", g) for g in range(3)])
        total = sum(lengths.values())
        for v, e in enumerate(executors):
            model_peak = cost.activation_bytes(total, virtual_stage=v)
            print(f"{pp:3} {v:5} {e.tracker.peak_bytes:16} {model_peak:13.0f} {e.tracker.peak_bytes / model_peak:7.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    numerics(args.plans, args.seed)
    memory()


if __name__ == "__main__":
    main()
