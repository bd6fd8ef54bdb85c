"""The process mesh: which rank runs which (replica, stage), and the process groups between them.

Ranks are laid out replica-major: rank = replica x pp + stage (tp = 1; the runtime does not shard
layers). A plan's pipeline runs on the ranks of its replicas; a pipeline merged into a CP group
(several replicas, DP-Merge) is executed by the ranks of its *first* replica only, unsplit (CP does
not change the numerics), and the other replicas' ranks sit idle for it. That keeps gradients exact;
it does not give the merged pipeline the speed of real context parallelism.

Process groups: one per stage holding that stage's rank in every replica (the data-parallel
gradient all-reduce of that stage's parameters); P2P neighbours are the previous and next stage of
the same replica (with virtual stages the last stage's next is stage 0 again).

This module holds pure layout arithmetic (``Mesh``) and ``build_process_groups``, which needs an
initialised ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slimpack.config import ParallelConfig
from slimpack.plan.types import PipelinePlan, Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Mesh:
    """dp x pp ranks. ``world_size`` must equal dp x pp (tp and cp are executed as 1, see above)."""

    dp: int
    pp: int

    def __post_init__(self) -> None:
        if self.dp < 1 or self.pp < 1:
            raise ValueError(f"a mesh needs dp >= 1 and pp >= 1, got dp={self.dp}, pp={self.pp}")

    @staticmethod
    def from_parallel(parallel: ParallelConfig) -> Mesh:
        if parallel.tp != 1:
            raise ValueError(f"the runtime executes tp = 1 only, the layout has tp={parallel.tp}")
        return Mesh(dp=parallel.dp, pp=parallel.pp)

    @property
    def world_size(self) -> int:
        return self.dp * self.pp

    def rank(self, replica: int, stage: int) -> int:
        if not (0 <= replica < self.dp and 0 <= stage < self.pp):
            raise ValueError(f"(replica {replica}, stage {stage}) is outside dp={self.dp} x pp={self.pp}")
        return replica * self.pp + stage

    def coords(self, rank: int) -> tuple[int, int]:
        """(replica, stage) of ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        return divmod(rank, self.pp)

    def stage_ranks(self, stage: int) -> tuple[int, ...]:
        """The ranks holding ``stage``'s parameters, one per replica: its DP all-reduce group."""
        return tuple(self.rank(r, stage) for r in range(self.dp))

    def next_rank(self, rank: int) -> int:
        """Where activations go (the next stage of the same replica; wraps for virtual stages)."""
        replica, stage = self.coords(rank)
        return self.rank(replica, (stage + 1) % self.pp)

    def prev_rank(self, rank: int) -> int:
        """Where activations come from (and gradients go)."""
        replica, stage = self.coords(rank)
        return self.rank(replica, (stage - 1) % self.pp)

    def executing_replica(self, pipeline: PipelinePlan) -> int:
        """The replica whose ranks run ``pipeline`` (the first of a merged CP group)."""
        return pipeline.replicas[0]

    def pipelines_of(self, plan: Plan, rank: int) -> list[int]:
        """Indices of the plan's pipelines that ``rank`` executes (its stage of each)."""
        replica, _ = self.coords(rank)
        return [i for i, pipe in enumerate(plan.pipelines) if self.executing_replica(pipe) == replica]

    def check_plan(self, plan: Plan) -> None:
        par = plan.config.parallel
        if (par.dp, par.pp) != (self.dp, self.pp):
            raise ValueError(f"the plan is for dp={par.dp} x pp={par.pp}, the mesh is dp={self.dp} x pp={self.pp}")
        for i, pipe in enumerate(plan.pipelines):
            bad = [r for r in pipe.replicas if not 0 <= r < self.dp]
            if bad or not pipe.replicas:
                raise ValueError(f"pipeline {i} names replicas {pipe.replicas}, outside dp={self.dp}")


@dataclass(slots=True)
class ProcessGroups:
    """This rank's groups: ``stage_group`` all-reduces its stage's gradients over replicas."""

    mesh: Mesh
    rank: int
    stage_group: Any
    """A ``torch.distributed`` process group (None for dp = 1: nothing to reduce)."""


def build_process_groups(mesh: Mesh) -> ProcessGroups:
    """Create the per-stage DP groups (every rank must call this, in the same order)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    if dist.get_world_size() != mesh.world_size:
        raise ValueError(f"the world has {dist.get_world_size()} ranks, the layout needs dp={mesh.dp} x "
                         f"pp={mesh.pp} = {mesh.world_size}")
    mine = None
    for stage in range(mesh.pp):
        group = dist.new_group(list(mesh.stage_ranks(stage)))  # collective: every rank creates every group
        if mesh.coords(rank)[1] == stage:
            mine = group
    return ProcessGroups(mesh=mesh, rank=rank, stage_group=mine if mesh.dp > 1 else None)
