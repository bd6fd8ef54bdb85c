"""Sliced varlen attention against a dense masked softmax written from the definition."""

from __future__ import annotations

import math

import pytest
import torch

from slimpack.runtime import kernels
from slimpack.runtime.attention import available_backends, resolve_backend, varlen_attention


def dense(q, k, v, cu_q, cu_k, prefix=None):
    """Per segment: keys = prefix ++ own; query t of n_q sees key j of n_k iff j <= t + n_k - n_q."""
    outs = []
    group = q.shape[1] // k.shape[1]
    for i in range(len(cu_q) - 1):
        pieces = prefix[i] if prefix else []
        ks = torch.cat([pk for pk, _ in pieces] + [k[cu_k[i]:cu_k[i + 1]]])
        vs = torch.cat([pv for _, pv in pieces] + [v[cu_k[i]:cu_k[i + 1]]])
        qs = q[cu_q[i]:cu_q[i + 1]]
        n_q, n_k = qs.shape[0], ks.shape[0]
        ks, vs = ks.repeat_interleave(group, dim=1), vs.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) / math.sqrt(q.shape[2])
        allowed = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q)
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, vs))
    return torch.cat(outs)


def make(shape, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=dtype).requires_grad_()


CPU_BACKENDS = ["math", "cpu"]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_segments_with_prefix_match_dense(heads, kv_heads, backend) -> None:
    cu_q = [0, 5, 6, 19, 27]
    q = make((27, heads, 8), 0)
    k, v = make((27, kv_heads, 8), 1), make((27, kv_heads, 8), 2)
    # segment 0 has no prefix, 1 has one piece, 2 has two pieces, 3 one piece
    sizes = [[], [3], [4, 7], [1]]
    prefix = [[(make((n, kv_heads, 8), 10 + 3 * i + j), make((n, kv_heads, 8), 50 + 3 * i + j))
               for j, n in enumerate(row)] for i, row in enumerate(sizes)]
    out = varlen_attention(q, k, v, cu_q, prefix=prefix, backend=backend)
    expected = dense(q, k, v, cu_q, cu_q, prefix)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    leaves = [q, k, v] + [t for row in prefix for piece in row for t in piece]
    got = torch.autograd.grad(out, leaves, grad)
    want = torch.autograd.grad(expected, leaves, grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_bottom_right_alignment(backend) -> None:
    """2 queries over 5 keys: query 0 sees keys 0..3, query 1 all five (flash-attn's example)."""
    q = torch.zeros(2, 1, 4, dtype=torch.float64)  # equal scores: output = mean of visible values
    k = torch.zeros(5, 1, 4, dtype=torch.float64)
    v = torch.arange(5, dtype=torch.float64).view(5, 1, 1).expand(5, 1, 4).contiguous()
    out = varlen_attention(q, k, v, [0, 2], [0, 5], backend=backend)
    torch.testing.assert_close(out[:, 0, 0], torch.tensor([1.5, 2.0], dtype=torch.float64))


def test_key_lengths_from_offsets_match_prefix_form() -> None:
    """Keys given in the packed k (cu_seqlens_k) or as a prefix piece: the same attention."""
    q = make((6, 2, 4), 0)
    k_all, v_all = make((10, 2, 4), 1), make((10, 2, 4), 2)
    by_offsets = varlen_attention(q, k_all, v_all, [0, 2, 6], [0, 4, 10], backend="math")
    by_prefix = varlen_attention(q, torch.cat([k_all[2:4], k_all[6:10]]), torch.cat([v_all[2:4], v_all[6:10]]),
                                 [0, 2, 6], prefix=[[(k_all[:2], v_all[:2])], [(k_all[4:6], v_all[4:6])]],
                                 backend="math")
    torch.testing.assert_close(by_offsets, by_prefix, rtol=1e-13, atol=1e-13)


def test_small_blocks_give_the_same_result(monkeypatch) -> None:
    q, k, v = make((40, 2, 4), 0), make((40, 1, 4), 1), make((40, 1, 4), 2)
    cu = [0, 33, 40]
    full = varlen_attention(q, k, v, cu, backend="math")
    grads = torch.autograd.grad(full.square().sum(), (q, k, v))
    monkeypatch.setattr(kernels, "MATH_BLOCK_ELEMENTS", 1)  # blocks of 16 queries
    blocked = varlen_attention(q, k, v, cu, backend="math")
    torch.testing.assert_close(blocked, full, rtol=1e-13, atol=1e-13)
    for a, b in zip(torch.autograd.grad(blocked.square().sum(), (q, k, v)), grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gradcheck(backend) -> None:
    q, k, v = make((5, 2, 3), 0), make((4, 1, 3), 1), make((4, 1, 3), 2)
    pk, pv = make((2, 1, 3), 3), make((2, 1, 3), 4)
    torch.autograd.gradcheck(
        lambda q_, k_, v_, pk_, pv_: varlen_attention(q_, k_, v_, [0, 3, 5], [0, 2, 4],
                                                      prefix=[[(pk_, pv_)], []], backend=backend),
        (q, k, v, pk, pv))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_saves_only_own_tensors_output_and_lse(backend) -> None:
    """Like FlashAttention: q, k, v, output, log-sum-exp (+ references to prefix pieces); no scores."""
    q, k, v = make((30, 4, 8), 0), make((30, 2, 8), 1), make((30, 2, 8), 2)
    pk, pv = make((50, 2, 8), 3), make((50, 2, 8), 4)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        varlen_attention(q, k, v, [0, 30], prefix=[[(pk, pv)]], backend=backend)
    assert sorted(saved) == sorted([(30, 4, 8), (30, 2, 8), (30, 2, 8), (30, 4, 8), (30, 4), (50, 2, 8), (50, 2, 8)])


def test_bad_arguments() -> None:
    q, k = make((4, 2, 4), 0), make((4, 2, 4), 1)
    with pytest.raises(ValueError, match="segment 0: 4 queries but only 3 keys"):
        varlen_attention(q, k[:3], k[:3], [0, 4], [0, 3])
    with pytest.raises(ValueError, match="unknown attention backend"):
        varlen_attention(q, k, k, [0, 4], backend="cudnn")
    with pytest.raises(ValueError, match="cannot run on cpu"):
        resolve_backend("flash", "cpu", torch.float32)
    with pytest.raises(ValueError, match="query heads 2 must be a multiple"):
        varlen_attention(q, make((4, 3, 4), 2), make((4, 3, 4), 3), [0, 4])
    assert available_backends("cpu", torch.float64) == ["cpu", "math"]
    assert available_backends("cpu", torch.float16) == ["math"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_and_math_backends_agree(dtype) -> None:
    """Many segments of mixed shapes (with and without prefix, n_k > n_q), forward and backward."""
    gen = torch.Generator().manual_seed(7)
    sizes_q = [1, 17, 64, 5, 130]
    sizes_prefix = [0, 40, 3, 200, 0]
    cu = [0]
    for n in sizes_q:
        cu.append(cu[-1] + n)
    q = torch.randn(cu[-1], 4, 16, generator=gen, dtype=dtype).requires_grad_()
    k = torch.randn(cu[-1], 2, 16, generator=gen, dtype=dtype).requires_grad_()
    v = torch.randn(cu[-1], 2, 16, generator=gen, dtype=dtype).requires_grad_()
    prefix = [[(torch.randn(n, 2, 16, generator=gen, dtype=dtype).requires_grad_(),
                torch.randn(n, 2, 16, generator=gen, dtype=dtype).requires_grad_())] if n else []
              for n in sizes_prefix]
    leaves = [q, k, v] + [t for row in prefix for piece in row for t in piece]
    grad = torch.randn(cu[-1], 4, 16, generator=gen, dtype=dtype)
    results = []
    for backend in CPU_BACKENDS:
        out = varlen_attention(q, k, v, cu, prefix=prefix, backend=backend)
        results.append([out, *torch.autograd.grad(out, leaves, grad)])
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["flash", "torch"])
def test_gpu_backends_agree_with_math(backend) -> None:
    if backend not in available_backends("cuda", torch.bfloat16):
        pytest.skip(f"backend {backend} is not installed")
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_()

    cu_q = [0, 64, 100, 228]
    q, k, v = rand(228, 8, 64), rand(228, 2, 64), rand(228, 2, 64)
    prefix = [[], [(rand(30, 2, 64), rand(30, 2, 64))], [(rand(17, 2, 64), rand(17, 2, 64))]]
    leaves = [q, k, v] + [t for row in prefix for piece in row for t in piece]
    grad = torch.randn(228, 8, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
    out = varlen_attention(q, k, v, cu_q, prefix=prefix, backend=backend)
    got = torch.autograd.grad(out, leaves, grad)
    # reference: the math backend in float32 on the same (bf16-rounded) inputs
    leaves32 = [t.detach().float().requires_grad_() for t in leaves]
    q32, k32, v32, *flat = leaves32
    prefix32 = [[], [(flat[0], flat[1])], [(flat[2], flat[3])]]
    ref = varlen_attention(q32, k32, v32, cu_q, prefix=prefix32, backend="math")
    want = torch.autograd.grad(ref, leaves32, grad.float())
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.float(), b, rtol=5e-2, atol=5e-2)


class _FakeFlash:
    """flash-attn's two varlen entry points, computed by the math kernels, with flash-attn's LSE
    layout (H, T) and its in-place gradient outputs; records every call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @staticmethod
    def _check(cu_q_t, cu_k_t, max_q, max_k, q):
        assert cu_q_t.dtype == cu_k_t.dtype == torch.int32 and cu_q_t.device == q.device
        assert (max_q, max_k) == (int(cu_q_t.diff().max()), int(cu_k_t.diff().max()))
        return cu_q_t.tolist(), cu_k_t.tolist()

    def _flash_attn_varlen_forward(self, q, k, v, cu_q_t, cu_k_t, max_q, max_k, *, dropout_p, softmax_scale, causal):
        assert dropout_p == 0.0 and causal
        self.calls.append("forward")
        out, lse_th = kernels.math_forward(q, k, v, *self._check(cu_q_t, cu_k_t, max_q, max_k, q), softmax_scale)
        return out, lse_th.T.contiguous(), torch.empty(0), torch.empty(2)

    def _flash_attn_varlen_backward(self, dout, q, k, v, out, lse, dq, dk, dv, cu_q_t, cu_k_t, max_q, max_k, *,
                                    dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                                    softcap, alibi_slopes, deterministic):
        assert lse.shape == (q.shape[1], q.shape[0]) and causal and softcap == 0.0 and alibi_slopes is None
        self.calls.append("backward")
        grads = kernels.math_backward(dout, q, k, v, out, lse.T, *self._check(cu_q_t, cu_k_t, max_q, max_k, q),
                                      softmax_scale)
        for target, grad in zip((dq, dk, dv), grads, strict=True):
            target.copy_(grad)
        return torch.empty(0)


class _FakeTorchVarlen:
    """torch's varlen ops (``torch.ops.torch_attn``), computed by the math kernels; records calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _varlen_attn(self, q, k, v, cu_q_t, cu_k_t, max_q, max_k, is_causal, scale, window_size, enable_gqa):
        assert is_causal and window_size == [-1, 0] and enable_gqa == (q.shape[1] != k.shape[1])
        self.calls.append("forward")
        out, lse_th = kernels.math_forward(q, k, v, *_FakeFlash._check(cu_q_t, cu_k_t, max_q, max_k, q), scale)
        return out, lse_th.T.contiguous(), torch.zeros(2)

    def _varlen_attn_backward(self, dout, q, k, v, out, lse, cu_q_t, cu_k_t, max_q, max_k, is_causal, rng,
                              scale, window_size):
        assert is_causal and window_size == [-1, 0]
        self.calls.append("backward")
        return kernels.math_backward(dout, q, k, v, out, lse.T, *_FakeFlash._check(cu_q_t, cu_k_t, max_q, max_k, q),
                                     scale)


@pytest.mark.parametrize(("backend", "fake", "hook"), [("flash", _FakeFlash, "flash_library"),
                                                        ("torch", _FakeTorchVarlen, "torch_library")])
def test_gpu_library_path_keeps_the_lse_and_calls_the_library_backward(monkeypatch, backend, fake, hook) -> None:
    """The GPU kernels' plumbing, on CPU with a stand-in library: one forward call per attention
    call, its LSE handed to one backward call (no forward rerun), prefix pieces concatenated into the
    packed keys; gradients equal the math backend's."""
    from slimpack.runtime import attention as attention_module

    library = fake()
    monkeypatch.setattr(kernels, hook, lambda: library)
    monkeypatch.setattr(attention_module, "resolve_backend", lambda name, device, dtype: name)
    q, k, v = make((12, 4, 8), 0), make((12, 2, 8), 1), make((12, 2, 8), 2)
    pieces = [(make((5, 2, 8), 3), make((5, 2, 8), 4)), (make((3, 2, 8), 5), make((3, 2, 8), 6))]
    leaves = [q, k, v, *[t for piece in pieces for t in piece]]
    grad = torch.randn(12, 4, 8, dtype=torch.float64)
    results = []
    for name in (backend, "math"):
        out = varlen_attention(q, k, v, [0, 4, 9, 12], prefix=[[], pieces, pieces[:1]], backend=name)
        results.append([out, *torch.autograd.grad(out, leaves, grad)])
    assert library.calls == ["forward", "backward"]
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_auto_on_cuda_refuses_the_math_fallback(monkeypatch) -> None:
    from slimpack.runtime import attention as attention_module

    monkeypatch.setattr(attention_module, "has_flash", lambda: True)
    monkeypatch.setattr(attention_module, "has_torch_varlen", lambda: False)
    assert resolve_backend("auto", "cuda", torch.bfloat16) == "flash"
    assert available_backends("cuda", torch.float32) == ["math"]
    with pytest.raises(ValueError, match="need bf16/fp16, not torch.float32; only the slow math kernel"):
        resolve_backend("auto", "cuda", torch.float32)
    assert resolve_backend("math", "cuda", torch.float32) == "math"  # asked for by name
    monkeypatch.setattr(attention_module, "has_flash", lambda: False)
    with pytest.raises(ValueError, match="no fused GPU kernel is installed"):
        resolve_backend("auto", "cuda", torch.bfloat16)
