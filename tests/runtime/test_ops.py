"""The custom autograd functions: gradients (gradcheck) and what they keep for backward."""

from __future__ import annotations

import torch

from slimpack.runtime.ops import apply_rope, rms_norm, rope_rotate, rope_tables, silu_gate


def rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).requires_grad_()


def saved_shapes(fn, *args):
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        fn(*args)
    return sorted(shapes)


def test_rms_norm() -> None:
    x, w = rand(5, 8), rand(8, seed=1)
    torch.autograd.gradcheck(rms_norm, (x, w))
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(rms_norm(x, w), expected)
    assert saved_shapes(rms_norm, x, w) == [(5, 1), (5, 8), (8,)]  # input, 1/rms, gain


def test_rope() -> None:
    cos, sin = rope_tables(torch.tensor([0, 1, 2, 7]), 6, dtype=torch.float64)
    x = rand(4, 3, 6)
    torch.autograd.gradcheck(lambda t: apply_rope(t, cos, sin), (x,))
    # position 0 is the identity; rotations keep norms
    torch.testing.assert_close(rope_rotate(x, cos, sin)[0], x[0])
    torch.testing.assert_close(rope_rotate(x, cos, sin).norm(dim=-1), x.norm(dim=-1))
    assert saved_shapes(apply_rope, x, cos, sin) == [(4, 3), (4, 3)]  # the shared tables only


def test_rope_depends_only_on_relative_position() -> None:
    q, k = rand(1, 1, 8), rand(1, 1, 8, seed=1)
    dots = []
    for shift in (0, 5, 100):
        cos, sin = rope_tables(torch.tensor([3 + shift, 1 + shift]), 8, dtype=torch.float64)
        pair = rope_rotate(torch.cat([q, k]), cos, sin)
        dots.append((pair[0] * pair[1]).sum())
    torch.testing.assert_close(dots[0], dots[1])
    torch.testing.assert_close(dots[0], dots[2])


def test_silu_gate() -> None:
    g, u = rand(4, 7), rand(4, 7, seed=1)
    torch.autograd.gradcheck(silu_gate, (g, u))
    torch.testing.assert_close(silu_gate(g, u), torch.nn.functional.silu(g) * u)
    assert saved_shapes(silu_gate, g, u) == [(4, 7), (4, 7)]
