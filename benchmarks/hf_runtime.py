"""Hugging Face models and bf16 mixed precision in the runtime: the figures in docs/runtime.md.

    PYTHONPATH=src python benchmarks/hf_runtime.py [--plans 30] [--seed 0]

1. float64: loss and gradient errors of transformers' tiny Llama and Qwen2 (written here, random
   weights) run through the executor vs their own unpacked forward/backward, on random plans
   (``runtime_numerics.random_pipeline``: random slices, groupings, asymmetric backward groups,
   action orders, 1/2/4 stages).
2. bf16 compute with float32 master gradients vs the float32 reference, on the same kind of plans,
   for the home-made tiny model and the HF Llama: the worst relative L2 gradient error of the sliced
   run and of the unsliced bf16 run of the same samples, and the loss error.
3. Kept activation bytes of the HF Llama of the tiny shape vs ``CostModel.activation_bytes``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import torch
from runtime_numerics import random_pipeline, valid_actions

from slimpack.config import ParallelConfig, TrainConfig, build_config, model_preset
from slimpack.cost import CostModel
from slimpack.plan.types import Action, PipelinePlan, Slice
from slimpack.runtime import build_executors, count_loss_tokens, random_tokens, run_in_order
from slimpack.runtime.models import build_runtime_model, reference_run
from slimpack.runtime.precision import MixedPrecision
from slimpack.runtime.verify import gradient_errors

TINY = model_preset("tiny")
SHAPE = {"hidden_size": TINY.hidden, "intermediate_size": TINY.ffn_hidden, "num_hidden_layers": TINY.num_layers,
         "num_attention_heads": TINY.num_heads, "num_key_value_heads": TINY.num_kv_heads,
         "vocab_size": TINY.vocab_size, "tie_word_embeddings": False}


def write_configs(folder: Path) -> dict[str, str]:
    paths = {}
    for kind in ("llama", "qwen2"):
        path = folder / kind / "config.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"model_type": kind, **SHAPE}))
        paths[kind] = str(path)
    return paths


def _grads(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in net.named_parameters()}


def run_plan(model: str, pipe: PipelinePlan, lengths: dict[int, int], rng: random.Random, *,
             precision: str) -> tuple[float, float, float]:
    """(loss error, worst gradient error, worst unsliced-bf16 gradient error) of one plan."""
    net = build_runtime_model(model, TINY, seed=0, dtype=torch.float64 if precision == "full" else torch.float32,
                              device="cpu")
    compute = net if precision == "full" else MixedPrecision(net).compute
    tokens = random_tokens(lengths, TINY.vocab_size, 0)
    num_loss = count_loss_tokens(lengths.values())
    executors = build_executors(compute, pipe, num_chunks=rng.choice([1, 2, 4]), sample_lengths=lengths,
                                tokens=tokens, num_loss_tokens=num_loss, backend="cpu")
    loss = run_in_order(executors, valid_actions(pipe, rng))
    grads = _grads(net)
    net.zero_grad(set_to_none=True)
    ref = reference_run(net, tokens, num_loss)
    ref_grads = _grads(net)
    errors = gradient_errors(grads, ref_grads)
    loss_err = abs(loss.item() - ref.item()) / abs(ref.item())
    if precision == "full":
        return loss_err, max(e.relative for e in errors), 0.0
    net.zero_grad(set_to_none=True)
    reference_run(compute, tokens, num_loss)
    baseline = max(e.relative_l2 for e in gradient_errors(_grads(net), ref_grads))
    return loss_err, max(e.relative_l2 for e in errors), baseline


def errors_table(models: dict[str, str], num_plans: int, seed: int, precision: str) -> None:
    print(f"\n{precision}: {'model':8} {'plans':>5} {'max loss err':>13} {'max grad err':>13} {'max unsliced':>13} "
          f"{'max sliced/unsliced':>20}")
    for name, model in models.items():
        rng = random.Random(seed)
        rows = []
        while len(rows) < num_plans:
            pipe, lengths = random_pipeline(rng)
            if max(lengths.values()) > 2:  # else Q/K gradients are exactly 0: only roundoff to compare
                rows.append(run_plan(model, pipe, lengths, rng, precision=precision))
        ratio = max(g / b for _, g, b in rows) if precision != "full" else float("nan")
        print(f"      {name:8} {len(rows):5} {max(r[0] for r in rows):13.2e} {max(r[1] for r in rows):13.2e} "
              f"{max(r[2] for r in rows):13.2e} {ratio:20.3f}")


def memory(model: str) -> None:
    s = Slice
    lengths = {0: 96, 1: 40, 2: 24, 3: 60}
    forward = ((s(0, 0, 32), s(1, 0, 40)), (s(0, 32, 64), s(2, 0, 24), s(3, 0, 30)), (s(0, 64, 96), s(3, 30, 60)))
    backward = ((s(0, 64, 96),), (s(3, 30, 60), s(0, 32, 64), s(2, 0, 24)), (s(3, 0, 30), s(0, 0, 32), s(1, 0, 40)))
    pipe = PipelinePlan(replicas=(0,), cp=1, forward=forward, backward=backward)
    print(f"\nHF Llama, tiny shape, float32: {'pp':>3} {'stage':>5} {'measured peak B':>16} {'model peak B':>13} "
          f"{'ratio':>7}")
    for pp in (1, 2, 4):
        config = build_config(model="tiny", parallel=ParallelConfig(pp=pp), train=TrainConfig(recompute="none"))
        net = build_runtime_model(model, TINY, seed=0, dtype=torch.float32, device="cpu")
        executors = build_executors(net, pipe, num_chunks=pp, sample_lengths=lengths,
                                    tokens=random_tokens(lengths, TINY.vocab_size),
                                    num_loss_tokens=count_loss_tokens(lengths.values()), track_memory=True)
        run_in_order(executors, [Action("F", g) for g in range(3)] + [Action("B", g) for g in range(3)])
        for v, e in enumerate(executors):
            model_peak = CostModel(config).activation_bytes(sum(lengths.values()), virtual_stage=v)
            print(f"{'':31}{pp:3} {v:5} {e.tracker.peak_bytes:16} {model_peak:13.0f} "
                  f"{e.tracker.peak_bytes / model_peak:7.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        paths = write_configs(Path(folder))
        errors_table(paths, args.plans, args.seed, "full")
        errors_table({"tiny": "tiny", "llama": paths["llama"]}, args.plans, args.seed, "bf16")
        memory(paths["llama"])


if __name__ == "__main__":
    main()
