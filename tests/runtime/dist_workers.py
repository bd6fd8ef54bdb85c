"""Functions the distributed tests run on each spawned rank (module level, so spawn can import them)."""

from __future__ import annotations

import os
import time

import torch

from slimpack.plan.types import PipelinePlan, Plan, Slice


def _tiny(plan: Plan):
    """The tiny model these checks run, its embedding tied where the plan's model ties its own."""
    import dataclasses

    from slimpack.config import model_preset

    return dataclasses.replace(model_preset("tiny"), tie_embeddings=plan.config.model.tie_embeddings)


def _unsliced_grads(plan: Plan, seed: int) -> tuple[float, dict[str, torch.Tensor]]:
    """Every sample alone, unsliced, plain torch ops (``runtime.reference``)."""
    from slimpack.runtime.model import build_model
    from slimpack.runtime.reference import reference_loss
    from slimpack.runtime.verify import plan_lengths, random_tokens

    config = _tiny(plan)
    net = build_model(config, seed=seed, dtype=torch.float64)
    loss = reference_loss(net, random_tokens(plan_lengths(plan), config.vocab_size, seed))
    return float(loss), {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                         for n, p in net.named_parameters()}


def _errors(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    largest = max(float(g.abs().max()) for g in ref.values())
    return {n: float((g - ref[n]).abs().max()) / max(float(ref[n].abs().max()), 1e-3 * largest)
            for n, g in grads.items()}


def _reference_grads(plan: Plan, seed: int) -> tuple[float, dict[str, torch.Tensor]]:
    from slimpack.runtime.loss import count_loss_tokens
    from slimpack.runtime.model import build_model
    from slimpack.runtime.pipeline import build_executors, default_actions, run_in_order
    from slimpack.runtime.verify import (
        plan_lengths,
        random_tokens,
        verify_plan,  # noqa: F401 - same helpers as verify
    )

    config = _tiny(plan)
    lengths = plan_lengths(plan)
    tokens = random_tokens(lengths, config.vocab_size, seed)
    net = build_model(config, seed=seed, dtype=torch.float64)
    loss = torch.zeros((), dtype=torch.float64)
    par = plan.config.parallel
    for pipe in plan.pipelines:
        executors = build_executors(net, pipe, num_chunks=par.pp * par.virtual_stages, sample_lengths=lengths,
                                    tokens=tokens, num_loss_tokens=count_loss_tokens(lengths.values()),
                                    backend="cpu", stages_per_pipeline=par.pp)
        loss = loss + run_in_order(executors, default_actions(pipe))
    return float(loss), {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                         for n, p in net.named_parameters()}


def gradient_check(rank: int, world_size: int, plan: Plan, seed: int) -> dict:
    """Run one step of ``plan`` distributed; compare loss and this rank's gradients with one process."""
    from slimpack.runtime.distributed import RankRuntime
    from slimpack.runtime.mesh import Mesh
    from slimpack.runtime.model import build_model
    from slimpack.runtime.tensor_parallel import full, local
    from slimpack.runtime.verify import plan_lengths, random_tokens

    config = _tiny(plan)
    net = build_model(config, seed=seed, dtype=torch.float64)
    tokens = random_tokens(plan_lengths(plan), config.vocab_size, seed)
    runtime = RankRuntime(net, Mesh.from_parallel(plan.config.parallel),
                          virtual_stages=plan.config.parallel.virtual_stages, backend="cpu", timeout_s=60)
    names = {id(p): n for n, p in net.named_parameters()}  # after tensor parallelism replaced them
    result = runtime.step(plan, tokens, optimizer_step=False)
    grads = {names[id(p)]: full(p.grad) for p in runtime.parameters}
    ref_loss, ref = _reference_grads(plan, seed)
    unsliced_loss, unsliced = _unsliced_grads(plan, seed)
    return {"loss": result.loss, "ref_loss": ref_loss, "errors": _errors(grads, ref),
            "whole_gradients": [names[id(p)] for p in runtime.parameters if local(p.grad).shape != local(p).shape],
            "unsliced_loss": unsliced_loss, "unsliced_errors": _errors(grads, unsliced), "stage": runtime.stage,
            "replica": runtime.replica, "actions": sum(s.kind in "FB" for s in result.spans),
            "position": tuple(runtime.position), "rows": sum(s.tokens for s in result.spans if s.kind == "F")}


def early_exit(rank: int, world_size: int, plan: Plan, ready_marker: str) -> dict:
    """Rank 1 dies before the step; the others must fail with a clear message, not hang. Rank 1 waits
    for rank 0's ``ready_marker`` (written once its process group is up): a rank that exits while
    gloo still connects the mesh fails rank 0 inside ``init_process_group``, not in the step this is
    about (seen once in CI)."""
    if rank == 1:
        give_up = time.monotonic() + 60
        while not os.path.exists(ready_marker) and time.monotonic() < give_up:
            time.sleep(0.05)
        os._exit(7)
    open(ready_marker, "w").close()  # noqa: SIM115 - an empty marker file
    began = time.monotonic()
    try:
        gradient_check(rank, world_size, plan, 0)
    except Exception as exc:  # noqa: BLE001 - the message is what the test checks
        return {"error": f"{type(exc).__name__}: {exc}", "elapsed": time.monotonic() - began}
    return {"error": None, "elapsed": time.monotonic() - began}


def hanging_rank(rank: int, world_size: int, plan: Plan, done_marker: str) -> dict:
    """Rank 1 hangs instead of joining the step, until rank 0 writes ``done_marker``; rank 0 (timeout
    5 s) must fail, naming it."""
    if rank == 1:
        give_up = time.monotonic() + 60
        while not os.path.exists(done_marker) and time.monotonic() < give_up:
            time.sleep(0.1)
        return {"error": None, "elapsed": 0.0}
    try:
        return _step_with_timeout(plan)
    finally:
        open(done_marker, "w").close()  # noqa: SIM115 - an empty marker file


def _step_with_timeout(plan: Plan) -> dict:
    from slimpack.config import model_preset
    from slimpack.runtime.distributed import RankRuntime
    from slimpack.runtime.mesh import Mesh
    from slimpack.runtime.model import build_model
    from slimpack.runtime.verify import plan_lengths, random_tokens

    net = build_model(model_preset("tiny"), seed=0, dtype=torch.float64)
    began = time.monotonic()
    try:
        runtime = RankRuntime(net, Mesh.from_parallel(plan.config.parallel), timeout_s=5)
        runtime.step(plan, random_tokens(plan_lengths(plan), 256, 0), optimizer_step=False)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}", "elapsed": time.monotonic() - began}
    return {"error": None, "elapsed": time.monotonic() - began}


def tensor_parallel_stages(rank: int, world_size: int, pipe: PipelinePlan, lengths: dict[int, int]) -> dict:
    """One process group = one tensor-parallel group: every rank runs all stages of ``pipe`` (one
    process, ``run_in_order``) on its shards, with the LM head vocabulary-parallel and gathered;
    loss and full gradients against the unsliced reference."""
    from torch.distributed.device_mesh import init_device_mesh

    from slimpack.config import model_preset
    from slimpack.runtime.loss import count_loss_tokens
    from slimpack.runtime.model import build_model
    from slimpack.runtime.pipeline import build_executors, default_actions, run_in_order
    from slimpack.runtime.reference import reference_loss
    from slimpack.runtime.tensor_parallel import full, loss_context, parallelize_model
    from slimpack.runtime.verify import random_tokens

    config = model_preset("tiny")
    tokens = random_tokens(lengths, config.vocab_size, 0)
    reference = build_model(config, seed=0)
    ref_loss = float(reference_loss(reference, tokens))
    ref = {n: p.grad for n, p in reference.named_parameters()}
    mesh = init_device_mesh("cpu", (world_size,))
    out: dict = {"ref_loss": ref_loss}
    for vocab_parallel in (True, False):
        net = parallelize_model(build_model(config, seed=0), mesh, vocab_parallel=vocab_parallel)
        with loss_context(world_size):
            executors = build_executors(net, pipe, num_chunks=2, sample_lengths=lengths, tokens=tokens,
                                        num_loss_tokens=count_loss_tokens(lengths.values()), backend="cpu")
            loss = float(run_in_order(executors, default_actions(pipe)))
        grads = {n: full(p.grad) for n, p in net.named_parameters()}
        out[vocab_parallel] = {"loss": loss, "errors": _errors(grads, ref)}
    out["shards"] = {n: tuple(p.to_local().shape) if hasattr(p, "to_local") else tuple(p.shape)
                     for n, p in net.named_parameters()}
    out["heads"] = (net.layers[0].num_heads, net.layers[0].num_kv_heads)
    return out


def context_parallel_stages(rank: int, world_size: int, pipe: PipelinePlan, lengths: dict[int, int]) -> dict:
    """All ranks form one cp group; each runs every stage of ``pipe`` (``run_in_order``) on its zigzag
    share of the tokens; losses and gradients summed over the ranks against the unsliced reference."""
    import torch.distributed as dist

    from slimpack.config import model_preset
    from slimpack.runtime.executor import StageExecutor
    from slimpack.runtime.loss import count_loss_tokens
    from slimpack.runtime.model import build_model
    from slimpack.runtime.pipeline import default_actions, run_in_order
    from slimpack.runtime.reference import reference_loss
    from slimpack.runtime.verify import random_tokens

    config = model_preset("tiny")
    tokens = random_tokens(lengths, config.vocab_size, 0)
    reference = build_model(config, seed=0)
    ref_loss = float(reference_loss(reference, tokens))
    net = build_model(config, seed=0)
    executors = [StageExecutor(stage, pipe.forward, pipe.backward, sample_lengths=lengths, tokens=tokens,
                               num_loss_tokens=count_loss_tokens(lengths.values()), backend="cpu",
                               shard=(rank, world_size), cp_group=dist.group.WORLD)
                 for stage in net.split(2)]
    loss = run_in_order(executors, default_actions(pipe)).detach()
    rows = sum(e.layout.group_tokens("F", g) for e in executors[:1] for g in range(len(pipe.forward)))
    dist.all_reduce(loss)
    grads = {}
    for n, p in net.named_parameters():
        dist.all_reduce(p.grad)
        grads[n] = p.grad
    ref = {n: p.grad for n, p in reference.named_parameters()}
    return {"loss": float(loss), "ref_loss": ref_loss, "errors": _errors(grads, ref), "rows": rows}


def collectives_of_one_layer(rank: int, world_size: int, num_tokens: int) -> dict:
    """Forward and backward of one middle layer (tiny model, one slice of ``num_tokens``), once
    tensor-parallel and once context-parallel over the 2 ranks: the collectives each issues."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from slimpack.config import model_preset
    from slimpack.runtime.collectives import CollectiveLog
    from slimpack.runtime.executor import StageExecutor
    from slimpack.runtime.model import build_model
    from slimpack.runtime.tensor_parallel import parallelize_model

    config = model_preset("tiny")
    groups = ((Slice(0, 0, num_tokens),),)
    out = {}
    for kind in ("tp", "cp"):
        net = build_model(config, seed=0)
        group = dist.group.WORLD
        if kind == "tp":
            mesh = init_device_mesh("cpu", (world_size,))
            parallelize_model(net, mesh)
            group = mesh.get_group()
        stage = net.stage(1, 2)
        executor = StageExecutor(stage, groups, groups, sample_lengths={0: num_tokens}, backend="cpu",
                                 **({"shard": (rank, world_size), "cp_group": dist.group.WORLD} if kind == "cp" else {}))
        rows = executor.layout.group_tokens("F", 0)
        generator = torch.Generator().manual_seed(rank)
        with CollectiveLog({kind: [group]}) as forward:
            executor.forward(0, torch.randn(rows, config.hidden, dtype=torch.float64, generator=generator))
        with CollectiveLog({kind: [group]}) as backward:
            executor.backward(0, torch.randn(rows, config.hidden, dtype=torch.float64, generator=generator))
        out[kind] = {"forward": forward.records, "backward": backward.records}
    return out


def hf_gradient_check(rank: int, world_size: int, plan: Plan, config_path: str, seed: int) -> dict:
    """One step of ``plan`` with transformers' model of ``config_path``; this rank's gradients (whole:
    tensor-parallel shards gathered) vs the model's own unpacked forward/backward of every sample in
    one process, on an unsharded copy; ``shards``: this rank's parameter shapes."""
    from slimpack.runtime.distributed import RankRuntime
    from slimpack.runtime.hf_model import build_hf_model, hf_reference_loss
    from slimpack.runtime.mesh import Mesh
    from slimpack.runtime.tensor_parallel import full, local
    from slimpack.runtime.verify import plan_lengths, random_tokens

    net = build_hf_model(config_path, seed=seed, dtype=torch.float64)
    tokens = random_tokens(plan_lengths(plan), net.config.vocab_size, seed)
    runtime = RankRuntime(net, Mesh.from_parallel(plan.config.parallel), backend="cpu", timeout_s=60)
    names = {id(p): n for n, p in net.named_parameters()}
    result = runtime.step(plan, tokens, optimizer_step=False)
    grads = {names[id(p)]: full(p.grad).clone() for p in runtime.parameters}
    reference = build_hf_model(config_path, seed=seed, dtype=torch.float64)
    ref_loss = float(hf_reference_loss(reference, tokens))
    ref = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in reference.named_parameters()}
    return {"loss": result.loss, "ref_loss": ref_loss, "errors": _errors(grads, {n: ref[n] for n in grads}),
            "position": tuple(runtime.position), "cp": [p.cp for p in plan.pipelines],
            "shards": {n: tuple(local(p).shape) for n, p in net.named_parameters()}}


def hf_collectives_of_one_layer(rank: int, world_size: int, config_path: str, num_tokens: int) -> dict:
    """Forward and backward of one middle decoder layer of transformers' model of ``config_path``
    (one slice of ``num_tokens``), tensor-parallel over the ranks: the collectives each issues."""
    from torch.distributed.device_mesh import init_device_mesh

    from slimpack.runtime.collectives import CollectiveLog
    from slimpack.runtime.executor import StageExecutor
    from slimpack.runtime.hf_model import build_hf_model
    from slimpack.runtime.hf_tensor_parallel import parallelize_hf_model

    mesh = init_device_mesh("cpu", (world_size,))
    net = parallelize_hf_model(build_hf_model(config_path, dtype=torch.float64), mesh)
    groups = ((Slice(0, 0, num_tokens),),)
    executor = StageExecutor(net.stage(1, 2), groups, groups, sample_lengths={0: num_tokens}, backend="cpu")
    generator = torch.Generator().manual_seed(0)  # the same input on every tp rank
    with CollectiveLog({"tp": [mesh.get_group()]}) as forward:
        executor.forward(0, torch.randn(num_tokens, net.config.hidden, dtype=torch.float64, generator=generator))
    with CollectiveLog({"tp": [mesh.get_group()]}) as backward:
        executor.backward(0, torch.randn(num_tokens, net.config.hidden, dtype=torch.float64, generator=generator))

    def elements(log: CollectiveLog) -> list[tuple[str, int]]:  # float64: 8 bytes an element
        return [(c.kind, int(c.size_bytes) // 8) for c in log.records]

    return {"forward": elements(forward), "backward": elements(backward)}


def tied_embedding_after_steps(rank: int, world_size: int, plan: Plan, steps: int) -> dict:
    """``steps`` AdamW steps of ``plan`` (the same batch each time) with the tiny model tied as the
    plan's is; this rank's copy of the embedding (or of the head it is tied to) at the start and end."""
    from slimpack.runtime.distributed import RankRuntime
    from slimpack.runtime.mesh import Mesh
    from slimpack.runtime.model import build_model
    from slimpack.runtime.verify import plan_lengths, random_tokens

    net = build_model(_tiny(plan), seed=0, dtype=torch.float64)
    tokens = random_tokens(plan_lengths(plan), net.config.vocab_size, 0)
    runtime = RankRuntime(net, Mesh.from_parallel(plan.config.parallel), backend="cpu", timeout_s=60,
                          virtual_stages=plan.config.parallel.virtual_stages,
                          optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2))
    before = net.embedding.weight.detach().clone()
    for _ in range(steps):
        runtime.step(plan, tokens)
    return {"stage": runtime.stage, "before": before.tolist(), "after": net.embedding.weight.detach().tolist()}


def gradient_layouts(rank: int, world_size: int) -> dict:
    """``like_parameter`` on a 2-rank tp mesh: a replicated gradient of a row-split parameter, and a
    partial gradient of a replicated one, each with how many collectives it issued."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    from slimpack.runtime.collectives import CollectiveLog
    from slimpack.runtime.tensor_parallel import like_parameter

    mesh = init_device_mesh("cpu", (world_size,))
    table = torch.arange(8.0).reshape(4, 2)
    split = distribute_tensor(table, mesh, [Shard(0)])
    whole_grad = distribute_tensor(table * 10, mesh, [Replicate()])
    partial = DTensor.from_local(torch.ones(2), mesh, [Partial()])
    gain = distribute_tensor(torch.ones(2), mesh, [Replicate()])
    with CollectiveLog({"tp": [mesh.get_group()]}) as log:
        cut = like_parameter(whole_grad, split)
        kept = like_parameter(partial, gain)
    return {"cut": str(cut.placements), "cut_local": cut.to_local().tolist(), "kept_same": kept is partial,
            "collectives": len(log.records)}
