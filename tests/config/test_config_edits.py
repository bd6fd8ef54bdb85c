"""A hand-edited config file (slimpack's, or a Hugging Face config.json): whatever one value is
replaced by (or a key removed), reading it and building its cost model either works or raises one
``UserError``, never another exception. Fuzzing found numpy overflows here (a layout of 2**31 GPUs,
a node of 10**30, a batch of 10**30 tokens) and TypeErrors (a list as model_type, {} as head_dim)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import REMOVED, edited
from slimpack.config import Config, build_config, model_from_hf_config
from slimpack.cost import CostModel
from slimpack.data.sampler import SamplerConfig
from slimpack.errors import UserError

BASE = build_config(model="tiny").to_dict()
HF_BASES = {path.stem: json.loads(path.read_text()) for path in sorted((Path(__file__).parent / "hf_configs").glob("*.json"))}
EXTREMES = [0, -1, 2**31, 2**40 + 1, 2**63, 10**30, 1e308, float("inf"), float("nan"), -0.0, True, None, "x", [],
            {}, REMOVED]
"""Tried on every field: hypothesis alone draws mostly small values."""


def _leaves(data: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for key, value in data.items():
        out += _leaves(value, (*prefix, key)) if isinstance(value, dict) else [(*prefix, key)]
    return out


def _read_edited(path: tuple, value: object) -> None:
    try:
        config = Config.from_dict(edited(BASE, path, value))
        cost = CostModel(config)
        cost.check_states_fit()
        assert cost.p2p_time(1024.0, from_stage=0, to_stage=min(1, config.parallel.pp - 1)) >= 0
        assert SamplerConfig.from_train(config.train).global_batch_tokens == config.train.global_batch_tokens
    except UserError:
        pass


@pytest.mark.parametrize("path", _leaves(BASE), ids=".".join)
def test_every_extreme_in_every_field_is_read_or_refused_with_one_user_error(path):
    for value in EXTREMES:
        _read_edited(path, value)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_leaves(BASE)),
       st.one_of(st.integers(min_value=-2**70, max_value=2**70), st.floats(), st.text(max_size=4),
                 st.lists(st.integers(min_value=-3, max_value=3), max_size=3)))
def test_any_random_edit_is_read_or_refused_with_one_user_error(path, value):
    _read_edited(path, value)


@pytest.mark.parametrize("name", ["Meta-Llama-3-8B", "Qwen3-8B", "gemma-2b"])
def test_every_extreme_in_every_hf_field_is_read_or_refused_with_one_user_error(name):
    base = HF_BASES[name]
    for path in _leaves(base):
        for value in EXTREMES:
            try:
                model = model_from_hf_config(edited(base, path, value), name=name)
                CostModel(build_config(model=model))
            except UserError:
                pass
