"""The model: shape from the config, deterministic initialisation, stages that share parameters."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from slimpack.config import model_preset
from slimpack.runtime import build_model

TINY = model_preset("tiny")


@pytest.mark.parametrize("variant", [{}, {"ffn_kind": "gelu"}, {"tie_embeddings": True}, {"num_kv_heads": 1}])
def test_parameter_count_is_the_configs(variant) -> None:
    config = dataclasses.replace(TINY, **variant)
    model = build_model(config)
    assert sum(p.numel() for p in model.parameters()) == config.num_params()


def test_initialisation_is_deterministic_per_seed() -> None:
    a, b, c = build_model(TINY, seed=1), build_model(TINY, seed=1), build_model(TINY, seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


def test_weights_do_not_depend_on_dtype_or_layer_count() -> None:
    """Seeding by parameter name: a float32 model is the float64 one rounded, and a deeper model
    starts with the same layers."""
    m64, m32 = build_model(TINY, dtype=torch.float64), build_model(TINY, dtype=torch.float32)
    deep = build_model(dataclasses.replace(TINY, num_layers=6))
    assert torch.equal(m64.layers[2].wq.weight.float(), m32.layers[2].wq.weight)
    assert torch.equal(m64.layers[3].w_down.weight, deep.layers[3].w_down.weight)


def test_stages_cover_the_model_once() -> None:
    model = build_model(TINY)
    stages = model.split(2)
    assert [(s.has_embedding, s.has_head) for s in stages] == [(True, False), (False, True)]
    owned = [{id(p) for p in s.parameters()} for s in stages]
    assert not owned[0] & owned[1]
    assert owned[0] | owned[1] == {id(p) for p in model.parameters()}
    assert repr(stages[1]) == "ModelStage(layers 2..3, head)"
    with pytest.raises(ValueError, match="cannot be split into 3"):
        model.split(3)


def test_tied_head_is_the_embedding() -> None:
    model = build_model(dataclasses.replace(TINY, tie_embeddings=True))
    last = model.split(4)[-1]
    assert last.head_weight is model.embedding.weight
