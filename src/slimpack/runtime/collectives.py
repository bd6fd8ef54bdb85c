"""Counting the collectives a rank runs: the runtime's side of ``CostModel.layer_collectives``.

``CollectiveLog`` is a dispatch mode: torch's c10d ops (``torch.distributed.all_gather`` and the
like, which ``context_parallel`` calls) and the functional collectives (which DTensor's tensor
parallelism issues) both pass through the dispatcher, where it records each collective on one of
the process groups it was given as a ``cost.comm.Collective`` (kind, the group's label, its size,
the whole tensor's bytes), so what the runtime sent compares with the cost model's list directly
(tests/runtime/test_comm_accounting.py, ``slimpack fidelity``). Collectives on other groups (the
gradient and loss all-reduces) are not recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from slimpack.cost.comm import Collective

# dispatcher op name -> (kind, where its group is: an argument index)
_OPS = {"allreduce_": ("all_reduce", 1), "allgather_": ("all_gather", 2), "reduce_scatter_": ("reduce_scatter", 2),
        "all_reduce": ("all_reduce", 2), "all_gather_into_tensor": ("all_gather", 2),
        "reduce_scatter_tensor": ("reduce_scatter", 3)}


def _per_rank_tensor(name: str, args: tuple) -> torch.Tensor:
    """The tensor whose size is one rank's part: an all-reduce's tensor, an all-gather's input, a
    reduce-scatter's output (c10d) or input (functional, whole)."""
    if name == "allreduce_":
        return args[0][0]
    if name == "allgather_":
        return args[1][0]
    if name == "reduce_scatter_":
        return args[0][0]
    return args[0]


class CollectiveLog(TorchDispatchMode):
    """Records the collectives run inside ``with CollectiveLog({"tp": [group], "cp": [...]}) as log:``
    on those groups, in order (``records``)."""

    def __init__(self, groups: Mapping[str, Iterable[Any]]) -> None:
        super().__init__()
        self._groups = {g.group_name: (label, dist.get_world_size(g)) for label, gs in groups.items() for g in gs}
        self.records: list[Collective] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        name = func._schema.name.split("::")[-1]
        if func.namespace in ("c10d", "_c10d_functional") and name in _OPS:
            kind, at = _OPS[name]
            group = args[at] if isinstance(args[at], str) else dist.ProcessGroup.unbox(args[at]).group_name
            if group in self._groups:
                label, ranks = self._groups[group]
                tensor = _per_rank_tensor(name, args)
                size = tensor.numel() * tensor.element_size()
                whole = name in ("all_reduce", "allreduce_", "reduce_scatter_tensor")
                self.records.append(Collective(kind, label, ranks, size if whole else size * ranks))
        return func(*args, **(kwargs or {}))

    def sent_bytes(self, label: str) -> float:
        """Bytes this rank sent in the ``label`` group's collectives (ring algorithms)."""
        return sum(c.sent_bytes() for c in self.records if c.group == label)
