"""The process mesh: which rank runs which (replica, stage, cp rank, tp rank), and its process groups.

Ranks are laid out as the cost model assumes (``config.parallel.layout_rank``): tensor-parallel
ranks innermost, then context, then data, then pipeline:

    rank = ((stage x dp + replica) x cp + cp_rank) x tp + tp_rank

so a tensor-parallel group is tp consecutive ranks and a replica's cp group of one stage is tp·cp
consecutive ranks. The replicas of a DP-Merge group need not be consecutive: the planner puts them
on one node where it can (``strategies.slimpack.phase1.place_merged``).

A plan's pipeline runs on the ranks of all its replicas. Its context-parallel group on one stage and
tp rank is, in order, the cp ranks of its first replica, then those of its second, ...: a pipeline of
the layout's cp on one replica, or a DP-Merge group of k replicas with cp·k ranks (``PipelinePlan.cp``).

Process groups: per (stage, tp rank), the dp·cp ranks holding the same parameter shards (the
data-parallel gradient all-reduce: every cp rank computes its own tokens' share of the gradients);
per pipeline with cp > 1, its cp group on each (stage, tp rank) (``ProcessGroups.cp_group``); the
tensor-parallel groups come from a ``DeviceMesh`` (torch's tensor-parallel API needs one). P2P
neighbours are the previous and next stage at the same (replica, cp rank, tp rank); with virtual
stages the last stage's next is stage 0 again.

This module holds pure layout arithmetic (``Mesh``) and ``build_process_groups``, which needs an
initialised ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from slimpack.config import ParallelConfig
from slimpack.config.parallel import layout_rank
from slimpack.plan.types import PipelinePlan, Plan


class Position(NamedTuple):
    replica: int
    stage: int
    cp_rank: int
    tp_rank: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Mesh:
    """tp x cp x dp x pp ranks (tp innermost)."""

    dp: int
    pp: int
    tp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        if min(self.dp, self.pp, self.tp, self.cp) < 1:
            raise ValueError(f"a mesh needs every degree >= 1, got tp={self.tp}, cp={self.cp}, dp={self.dp}, "
                             f"pp={self.pp}")

    @staticmethod
    def from_parallel(parallel: ParallelConfig) -> Mesh:
        return Mesh(dp=parallel.dp, pp=parallel.pp, tp=parallel.tp, cp=parallel.cp)

    def __str__(self) -> str:
        return f"tp={self.tp} x cp={self.cp} x dp={self.dp} x pp={self.pp}"

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def rank(self, replica: int, stage: int, *, cp_rank: int = 0, tp_rank: int = 0) -> int:
        if not (0 <= replica < self.dp and 0 <= stage < self.pp and 0 <= cp_rank < self.cp
                and 0 <= tp_rank < self.tp):
            raise ValueError(f"(replica {replica}, stage {stage}, cp rank {cp_rank}, tp rank {tp_rank}) is "
                             f"outside {self}")
        return layout_rank(replica, stage, cp_rank, tp_rank, dp=self.dp, cp=self.cp, tp=self.tp)

    def position(self, rank: int) -> Position:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        rest, tp_rank = divmod(rank, self.tp)
        rest, cp_rank = divmod(rest, self.cp)
        stage, replica = divmod(rest, self.dp)
        return Position(replica, stage, cp_rank, tp_rank)

    def coords(self, rank: int) -> tuple[int, int]:
        """(replica, stage) of ``rank``."""
        pos = self.position(rank)
        return pos.replica, pos.stage

    def peer(self, rank: int, stage: int) -> int:
        """The rank at ``stage`` with the same replica, cp rank and tp rank as ``rank``."""
        pos = self.position(rank)
        return self.rank(pos.replica, stage, cp_rank=pos.cp_rank, tp_rank=pos.tp_rank)

    def stage_ranks(self, stage: int, tp_rank: int = 0) -> tuple[int, ...]:
        """The ranks holding the same parameter shards as (``stage``, ``tp_rank``), one per replica and
        cp rank: their gradient all-reduce group."""
        return tuple(self.rank(r, stage, cp_rank=c, tp_rank=tp_rank) for r in range(self.dp) for c in range(self.cp))

    def cp_ranks(self, pipeline: PipelinePlan, stage: int, tp_rank: int = 0) -> tuple[int, ...]:
        """The context-parallel group of ``pipeline`` on (``stage``, ``tp_rank``), in shard order."""
        return tuple(self.rank(r, stage, cp_rank=c, tp_rank=tp_rank) for r in pipeline.replicas for c in range(self.cp))

    def cp_shard(self, pipeline: PipelinePlan, rank: int) -> tuple[int, int]:
        """(index of ``rank`` in ``pipeline``'s cp group, the group's size): the executor's ``shard``."""
        pos = self.position(rank)
        ranks = self.cp_ranks(pipeline, pos.stage, pos.tp_rank)
        return ranks.index(rank), len(ranks)

    def pipelines_of(self, plan: Plan, rank: int) -> list[int]:
        """Indices of the plan's pipelines that ``rank`` takes part in (its stage of each)."""
        replica = self.position(rank).replica
        return [i for i, pipe in enumerate(plan.pipelines) if replica in pipe.replicas]

    def check_plan(self, plan: Plan) -> None:
        par = plan.config.parallel
        if Mesh.from_parallel(par) != self:
            raise ValueError(f"the plan is for tp={par.tp} x cp={par.cp} x dp={par.dp} x pp={par.pp}, the mesh is "
                             f"{self}")
        for i, pipe in enumerate(plan.pipelines):
            bad = [r for r in pipe.replicas if not 0 <= r < self.dp]
            if bad or not pipe.replicas:
                raise ValueError(f"pipeline {i} names replicas {pipe.replicas}, outside dp={self.dp}")
            if pipe.cp != self.cp * len(pipe.replicas):
                raise ValueError(f"pipeline {i} has cp={pipe.cp} but runs on {len(pipe.replicas)} replica(s) of "
                                 f"cp={self.cp}")


@dataclass(slots=True)
class ProcessGroups:
    """This rank's groups."""

    mesh: Mesh
    rank: int
    stage_group: Any
    """All-reduces this rank's parameter gradients over dp x cp (None when dp·cp = 1)."""
    tp_mesh: Any = None
    """The 1-D tensor-parallel ``DeviceMesh`` of this rank (None for tp = 1)."""
    embedding_group: Any = None
    """A tied embedding's pair: this first- or last-stage rank and its counterpart on the other
    end of the pipeline, which sum the embedding's gradient (None elsewhere, or untied)."""
    _cp_groups: dict[tuple[int, ...], Any] = field(default_factory=dict)

    def cp_group(self, ranks: tuple[int, ...]) -> Any:
        """The process group of these ranks (created by ``ensure_cp_groups``)."""
        return self._cp_groups[ranks]

    def cp_groups(self) -> list[Any]:
        """Every cp group created so far that this rank belongs to."""
        return [g for ranks, g in self._cp_groups.items() if self.rank in ranks]

    def ensure_cp_groups(self, plan: Plan) -> None:
        """Create the cp groups of ``plan``'s pipelines that do not exist yet. Collective: every rank
        calls it with the same plan, so every rank creates the same groups in the same order."""
        import torch.distributed as dist

        for pipe in plan.pipelines:
            if pipe.cp == 1:
                continue
            for stage in range(self.mesh.pp):
                for tp_rank in range(self.mesh.tp):
                    ranks = self.mesh.cp_ranks(pipe, stage, tp_rank)
                    if ranks not in self._cp_groups:
                        self._cp_groups[ranks] = dist.new_group(list(ranks))


def build_process_groups(mesh: Mesh, *, tied_embeddings: bool = False) -> ProcessGroups:
    """Create the gradient groups and the tensor-parallel mesh (every rank calls this, in the same
    order), and with ``tied_embeddings`` over several stages the first and last stages' pairs. One
    line of error when the world does not match the layout."""
    import torch.distributed as dist

    rank = dist.get_rank()
    if dist.get_world_size() != mesh.world_size:
        raise ValueError(f"the world has {dist.get_world_size()} ranks, the layout {mesh} needs {mesh.world_size}")
    pos = mesh.position(rank)
    mine = None
    for stage in range(mesh.pp):
        for tp_rank in range(mesh.tp):
            group = dist.new_group(list(mesh.stage_ranks(stage, tp_rank)))  # collective: every rank creates every group
            if (pos.stage, pos.tp_rank) == (stage, tp_rank):
                mine = group
    pair = None
    for replica in range(mesh.dp) if tied_embeddings and mesh.pp > 1 else ():
        for cp_rank in range(mesh.cp):
            for tp_rank in range(mesh.tp):
                ends = [mesh.rank(replica, stage, cp_rank=cp_rank, tp_rank=tp_rank) for stage in (0, mesh.pp - 1)]
                group = dist.new_group(ends)
                if rank in ends:
                    pair = group
    tp_mesh = None
    if mesh.tp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        full = init_device_mesh(device, (mesh.pp, mesh.dp, mesh.cp, mesh.tp), mesh_dim_names=("pp", "dp", "cp", "tp"))
        tp_mesh = full["tp"]
    return ProcessGroups(mesh=mesh, rank=rank, stage_group=mine if mesh.dp * mesh.cp > 1 else None, tp_mesh=tp_mesh,
                         embedding_group=pair)
