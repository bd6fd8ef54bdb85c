"""Mixed precision as large-model training runs it: bf16 compute, fp32 master weights, fp32 gradients.

``MixedPrecision(master)`` keeps the model the caller built (float32: the master weights the
optimizer updates) and makes a bf16 copy (``compute``) that the executors run, so activations, the
tensors kept for backward and the P2P transfers are bf16. Every time autograd has accumulated a
gradient into a compute parameter, a hook adds it, cast to float32, into the master parameter's
``.grad`` and drops the bf16 one: gradients accumulate over cells, groups and pipelines in float32
(Megatron's ``main_grad``), and the data-parallel reduction and the optimizer see float32 only.
``sync()`` copies the master weights into the compute copy after an optimizer step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from slimpack.runtime.tensor_parallel import like_parameter


class MixedPrecision:
    def __init__(self, master: nn.Module, compute_dtype: torch.dtype = torch.bfloat16) -> None:
        if next(master.parameters()).dtype != torch.float32:
            raise ValueError("mixed precision keeps float32 master weights: build the model in float32")
        self.master = master
        # deepcopy keeps tied parameters tied, so both lists hold each parameter once, in one order
        self.compute = copy.deepcopy(master).to(compute_dtype)
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        self.pair()

    def pair(self) -> None:
        """Pair each compute parameter with its master and hook its gradient into the master's; again
        after tensor parallelism has replaced both models' parameters with their shards (the hooks
        made before are removed first: a parameter it left in place, such as transformers' replicated
        norms, would otherwise move its gradient twice)."""
        for hook in self._hooks:
            hook.remove()
        self.pairs = list(zip(self.compute.parameters(), self.master.parameters(), strict=True))
        self._master_of = {id(c): m for c, m in self.pairs}
        self._hooks = [compute_param.register_post_accumulate_grad_hook(_into(master_param))
                       for compute_param, master_param in self.pairs]

    def masters(self, compute_params: list[nn.Parameter]) -> list[nn.Parameter]:
        """The master parameter of each compute parameter."""
        return [self._master_of[id(p)] for p in compute_params]

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the master weights into the compute model (after an optimizer step)."""
        for compute_param, master_param in self.pairs:
            compute_param.copy_(master_param)


def _into(master: nn.Parameter) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:
        assert param.grad is not None
        grad = like_parameter(param.grad, master).to(master.dtype)  # a split master keeps a split gradient
        master.grad = grad if master.grad is None else master.grad.add_(grad)
        param.grad = None
    return hook
