import pytest
from hypothesis import given
from hypothesis import strategies as st

from slimpack.config import model_preset
from slimpack.cost import (
    attention_pairs,
    layer_backward_flops,
    layer_forward_flops,
    model_training_flops,
)

LLAMA2_7B = model_preset("llama2-7b")


def test_forward_flops_per_layer_hand_computed():
    # linear: 2*4096*(4096+2*4096) + 2*4096^2 + 2*3*4096*11008 = 404,750,336 per token
    # attention: 4*4096 * 8192*8193/2 pairs
    assert layer_forward_flops(LLAMA2_7B, 8192, 0) == 404_750_336 * 8192 + 16384 * 33_558_528
    assert layer_forward_flops(LLAMA2_7B, 8192, 0) == pytest.approx(3.8655e12, rel=1e-4)
    assert layer_forward_flops(LLAMA2_7B, 8192, 122880) == pytest.approx(2.0358e13, rel=1e-4)


def test_backward_factors_and_recomputation():
    linear = 404_750_336 * 1024
    attention = 16384 * attention_pairs(1024, 2048)
    assert layer_backward_flops(LLAMA2_7B, 1024, 2048) == 2 * linear + 2.5 * attention
    assert layer_backward_flops(LLAMA2_7B, 1024, 2048, recompute="selective") == 2 * linear + 3.5 * attention
    assert layer_backward_flops(LLAMA2_7B, 1024, 2048, recompute="full") == 3 * linear + 3.5 * attention


def test_gqa_shrinks_qkv_only():
    llama3 = model_preset("llama3-8b")  # 8 KV heads of 128: K and V are 1024 wide
    per_token = 2 * 4096 * (4096 + 2 * 1024) + 2 * 4096 * 4096 + 2 * 3 * 4096 * 14336
    assert layer_forward_flops(llama3, 1, 0) == per_token + 4 * 4096 * 1


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=8))
def test_slicing_conserves_flops(cuts):
    length = sum(cuts)
    prefix, total = 0, 0
    for tokens in cuts:
        total += layer_forward_flops(LLAMA2_7B, tokens, prefix)
        prefix += tokens
    assert total == layer_forward_flops(LLAMA2_7B, length, 0)
    assert sum(attention_pairs(c, sum(cuts[:i])) for i, c in enumerate(cuts)) == length * (length + 1) // 2


def test_training_flops_follow_six_n_d_plus_attention():
    length = 4096
    m = LLAMA2_7B
    matrix_params = m.num_layers * (4096 * 12288 + 4096 * 4096 + 3 * 4096 * 11008) + 32000 * 4096
    attention = m.num_layers * 3.5 * 4 * 4096 * length * (length + 1) / 2
    assert model_training_flops(m, length) == pytest.approx(6 * matrix_params * length + attention, rel=1e-12)
    # and 6*N*D with N the full parameter count is within a hair (norms and the input embedding differ)
    assert model_training_flops(m, length) - attention == pytest.approx(6 * m.num_params() * length, rel=0.02)
