"""A tiny Hugging Face Llama trained from slimpack's packed batches (DDP, gloo) and the same model
trained on every sample alone, unpacked; module level so ``spawn`` can import it."""

from __future__ import annotations

import numpy as np
import torch

VOCAB = 64
MAX_CONTEXT = 128


def hf_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_CONTEXT,
                       tie_word_embeddings=False)


def build_model(seed: int):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(hf_llama_config()).to(torch.float64)
    model.config._attn_implementation = "sdpa"
    model.config.use_cache = False  # else transformers does not look for packed rows (see slimpack.integrations.hf)
    return model


def token_rows(lengths: list[int], seed: int) -> list[dict[str, list[int]]]:
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, VOCAB, size=n).tolist()} for n in lengths]


def loss_sum(model, input_ids, labels, position_ids=None):
    """Σ token cross-entropies, as transformers' causal-LM loss computes it (labels shifted inside,
    -100 ignored) but in float64: its own loss casts the logits to float32, which would hide a
    packing error below float32 rounding."""
    logits = model(input_ids=input_ids, position_ids=position_ids).logits
    return torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=-100,
                                             reduction="sum")


class HandStep:
    """A hand-made plan as a planned step: plan sample id i is the whole token row i."""

    def __init__(self, plan) -> None:
        from slimpack.data import DocumentChunk

        self.plan = plan
        self.sources = {s.id: DocumentChunk(id=s.id, length=s.length, doc_index=s.id, chunk=0, epoch=0)
                        for s in plan.samples}


def train_packed(rank: int, world_size: int, rows, config, num_steps: int, lr: float, strategy: str) -> dict:
    """DDP over ``world_size`` gloo ranks, each fed its micro-batches by ``plan_data_loader``."""
    from slimpack.integrations.hf import plan_data_loader

    return _train_ddp(world_size, plan_data_loader(rows, config, rank=rank, num_steps=num_steps, strategy=strategy), lr)


def train_hand_plans(rank: int, world_size: int, rows, plans, lr: float) -> dict:
    """DDP as in :func:`train_packed`, fed the micro-batches of hand-made plans (:class:`HandStep`)."""
    from torch.utils.data import DataLoader

    from slimpack.integrations.hf import PlanBatchSampler, TokenRows, packed_batch

    sampler = PlanBatchSampler([HandStep(plan) for plan in plans], rank=rank, max_context=MAX_CONTEXT)
    return _train_ddp(world_size, DataLoader(TokenRows(rows), batch_sampler=sampler, collate_fn=packed_batch), lr)


def _train_ddp(world_size: int, loader, lr: float) -> dict:
    """The training loop docs/integrations.md shows: Σ token losses / the global batch's loss tokens."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    model = DistributedDataParallel(build_model(seed=0))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    sampler = loader.batch_sampler
    batches = iter(loader)
    losses, first_grads, seen = [], None, []
    for step, count in enumerate(sampler.micro_batches_per_step):
        # DDP averages gradients over ranks; scaling by world_size leaves Σ(token losses) / N.
        per_rank_items = sampler.loss_tokens(step) / world_size
        local = torch.zeros((), dtype=torch.float64)
        for i in range(count):
            batch = next(batches)
            seen.extend(batch["cu_seq_lens_q"].diff().tolist())
            args = (batch["input_ids"], batch["labels"], batch["position_ids"])
            if i < count - 1:
                with model.no_sync():
                    loss = loss_sum(model, *args) / per_rank_items
                    loss.backward()
            else:
                loss = loss_sum(model, *args) / per_rank_items
                loss.backward()
            local += loss.detach()
        dist.all_reduce(local)
        losses.append(float(local) / world_size)
        if first_grads is None:
            first_grads = {n: p.grad.clone() for n, p in model.module.named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"losses": losses, "first_grads": first_grads, "micro_batches": sampler.micro_batches_per_step,
            "params": {n: p.detach().clone() for n, p in model.module.named_parameters()},
            "sample_lengths": seen}


def train_unpacked(step_samples: list[list[list[int]]], lr: float) -> dict:
    """One process, every sample its own forward (no packing), loss over the step's loss tokens."""
    model = build_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses, first_grads = [], None
    for samples in step_samples:
        total_items = sum(len(s) - 1 for s in samples)
        loss = torch.zeros((), dtype=torch.float64)
        for tokens in samples:
            ids = torch.tensor(tokens)[None]
            sample_loss = loss_sum(model, ids, ids) / total_items
            sample_loss.backward()
            loss += sample_loss.detach()
        losses.append(float(loss))
        if first_grads is None:
            first_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"losses": losses, "first_grads": first_grads,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
