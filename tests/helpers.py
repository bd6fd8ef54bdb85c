"""Test doubles and small plan builders shared by the tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from slimpack.config import Config, ParallelConfig, TrainConfig, build_config
from slimpack.cost import CostModel
from slimpack.plan.types import PipelinePlan, Plan, Sample, Slice


class UniformCost:
    """A cost model where every forward takes ``t_f`` per chunk and every backward ``t_b``, with no
    communication, no stage extras, and one byte kept per token: for closed-form checks."""

    def __init__(self, config: Config, t_f: float = 1.0, t_b: float = 2.0) -> None:
        self.config = config
        self.t_f, self.t_b = t_f, t_b

    def group_time(self, tokens, prefix, *, virtual_stage, backward, cp=None):
        return self.t_b if backward else self.t_f

    def attention_terms(self, tokens, prefix, cp):
        return np.zeros(len(tokens))

    groups_sums = CostModel.groups_sums  # the real reduction, over this model's attention terms

    def cells_time(self, totals, attention, *, virtual_stage, backward, cp, cross_node=None):
        """Every cell costs a group's time (the simulator sums a group's cells)."""
        return np.full(len(totals), self.group_time((), (), virtual_stage=virtual_stage, backward=backward))

    def p2p_time(self, tokens, *, from_stage, to_stage, cp=None, replicas=(0,)):
        return 0.0

    def activation_bytes(self, tokens, *, virtual_stage, cp=None):
        return np.asarray(tokens, dtype=np.float64)

    def working_bytes(self, tokens, *, cp=None):
        return 0.0

    def model_state_bytes(self, stage):
        return 0.0

    def grad_sync_time(self, stage):
        return 0.0

    def optimizer_time(self, stage):
        return 0.0

    def whole_document_seconds(self, lengths):
        """The work of a one-group-per-sample plan: (t_f + t_b) per chunk per sample."""
        par = self.config.parallel
        return len(lengths) * (self.t_f + self.t_b) * par.pp * par.virtual_stages * par.dp * par.tp * par.cp


def config(pp: int = 4, dp: int = 1, vpp: int = 1, model: str = "llama2-7b", **train) -> Config:
    return build_config(model=model, parallel=ParallelConfig(pp=pp, dp=dp, virtual_stages=vpp),
                        train=TrainConfig(**train))


def one_sample_per_group_plan(cfg: Config, m: int, length: int = 1, order=None) -> Plan:
    samples = tuple(Sample(id=i, length=length) for i in range(m))
    groups = tuple((Slice(i, 0, length),) for i in range(m))
    pipe = PipelinePlan(replicas=(0,), cp=cfg.parallel.cp, forward=groups, backward=groups, order=order)
    return Plan(config=cfg, strategy="test", samples=samples, pipelines=(pipe,))


def synthetic_batch(seed: int, num_tokens: int, max_context: int, *, first_id: int = 0, step: int = 0) -> list[Sample]:
    """Long-tailed document lengths (lognormal body, Pareto tail), cut into context-length chunks as
    the data sampler does, until ``num_tokens`` tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    samples: list[Sample] = []
    total = 0
    while total < num_tokens:
        body = rng.lognormal(mean=7.0, sigma=1.2)
        length = int(body if rng.random() > 0.08 else 4096 * (1.0 + rng.pareto(1.1)))
        for start in range(0, max(1, length), max_context):
            n = max(1, min(max_context, length - start))
            samples.append(Sample(id=first_id + len(samples), length=n, arrival_step=step))
            total += n
    return samples


REMOVED = object()
"""``edited``'s value that deletes the key instead."""


def edited(data: dict, path: tuple, value: object) -> dict:
    """A deep copy of ``data`` with the entry at ``path`` (keys and list indices) set to ``value``, or
    deleted for ``REMOVED``: one hand edit of a config or plan file."""
    data = copy.deepcopy(data)
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if value is REMOVED:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return data


TINY_HF = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 64, "tie_word_embeddings": False, "initializer_range": 0.2}
"""A tiny Hugging Face config's fields (with its ``model_type``). initializer_range 0.2 (not the
usual 0.02): attention patterns far from uniform, so a wrong mask, position or prefix changes the
numbers."""


def write_hf_config(path: Path, model_type: str = "llama", **fields: object) -> str:
    """A tiny config.json of ``model_type`` (``TINY_HF`` with ``fields`` over it) at ``path``."""
    path.write_text(json.dumps({"model_type": model_type, **TINY_HF, **fields}))
    return str(path)
