"""flashref.torch: the autograd adapter, against SDPA (GPU tests need torch and a GPU).

Two comparisons, both on the same (fp16- or bf16-rounded) inputs and the same upstream
gradient dO:

- forward and gradients against SDPA's MATH backend in float32 (upcast inputs; TF32 is off
  by default), allowed twice the error of SDPA's own default backend in the low precision,
  plus a floor. Where Nq != Nk the yardstick is the naive attention below instead: not
  every fused SDPA backend aligns a causal mask top-left when the lengths differ;
- the gradcheck-style check. ``torch.autograd.gradcheck`` needs float64 inputs, which the
  kernels do not take, so instead the float64 gradients of SDPA's MATH backend are the
  truth (autograd through float64 attention is exact to ~1e-16, far below fp16's 1e-3),
  and the kernels' gradients may be off by at most twice what a naive attention in the same
  low precision (matmul, softmax, matmul, differentiated by autograd) is off, plus a floor.

Errors are max |x - ref| / max |ref| (absolute where ref is all zeros), and a failure names
the tensor, the shape, the worst element, the error and the tolerance. NaN fails. A
yardstick off by more than ``YARDSTICK_MAX`` fails too, so that a broken yardstick cannot
make the tolerance so loose that the test passes whatever flashref returns.
"""

from __future__ import annotations

import subprocess
import sys
import zlib

import pytest

from flashref.gpu.tolerances import FLOOR

# (leading dims, Nq, Nk): N = 1, primes, not multiples of any tile, Nq != Nk both ways
SHAPES = [
    ((1, 1), 1, 1),
    ((2, 3), 17, 17),
    ((1, 2), 257, 257),
    ((2,), 100, 37),
    ((1, 2), 37, 300),
    ((1, 1), 1000, 1000),
]
YARDSTICK_MAX = 0.05  # bf16's naive error is ~1e-2; anything far above means a broken yardstick
CASES = [
    (dt, d, c, *s)
    for dt in ("float16", "bfloat16")
    for d in (64, 128)
    for c in (False, True)
    for s in SHAPES
]


def _id(case):
    dt, d, c, lead, Nq, Nk = case
    return f"{dt}-d{d}-{'causal' if c else 'full'}-{'x'.join(map(str, lead))}-{Nq}x{Nk}"


def test_import_without_torch_says_what_is_missing():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # as if torch were not installed
        "import flashref, flashref.gpu, flashref.transformer.model\n"
        "import flashref.transformer.booktext, flashref.recorded\n"
        "try:\n    import flashref.torch\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "flashref.torch needs PyTorch, and the package 'torch' is not installed" in out.stdout


def test_nothing_else_imports_torch():
    code = (
        "import sys, flashref, flashref.gpu, flashref.transformer.model, "
        "flashref.transformer.booktext, flashref.recorded, flashref.exercises, flashref.bench\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# Argument checks: they run before any GPU work, so they are tested on CPU tensors.


@pytest.fixture
def fa(torch):
    import flashref.torch

    return flashref.torch


def _t(torch, *shape, dtype="float16", grad=False):
    return torch.zeros(shape, dtype=getattr(torch, dtype), requires_grad=grad)


def test_not_a_tensor(torch, fa):
    import numpy as np

    with pytest.raises(TypeError, match="key must be a torch.Tensor, got ndarray"):
        fa.attention(_t(torch, 4, 64), np.zeros((4, 64)), _t(torch, 4, 64))


def test_cpu_tensors_are_refused(torch, fa):
    with pytest.raises(TypeError, match="query is a torch tensor on cpu; move it to the GPU"):
        fa.attention(*(_t(torch, 2, 8, 64) for _ in range(3)))


def test_backward_limits_are_checked_first(torch, fa):
    q, k, v = (_t(torch, 2, 8, 64, dtype="float32") for _ in range(3))
    with pytest.raises(TypeError, match="key requires grad but has dtype float32"):
        fa.attention(q, k.requires_grad_(), v)
    with torch.no_grad(), pytest.raises(TypeError, match="on cpu"):  # forward only: allowed
        fa.attention(q, k, v)
    q, k, v = (_t(torch, 2, 8, 32, grad=True) for _ in range(3))
    with pytest.raises(ValueError, match="query requires grad but query has head dim d=32"):
        fa.attention(q, k, v)


def test_grouped_heads_pass_the_checks(torch, fa):
    # the forward and the backward take grouped K/V heads: the checks pass, the device is next
    q = _t(torch, 1, 8, 4, 64, grad=True)
    k, v = _t(torch, 1, 2, 4, 64), _t(torch, 1, 2, 4, 64)
    with pytest.raises(TypeError, match="on cpu"):
        fa.attention(q, k, v, enable_gqa=True)
    with pytest.raises(ValueError, match="grouped heads need enable_gqa=True"):  # as SDPA
        fa.attention(q, k, v)


def test_sdpa_arguments_not_implemented_are_named(torch, fa):
    q = _t(torch, 2, 8, 64)
    with pytest.raises(NotImplementedError, match="attn_mask is not supported"):
        fa.attention(q, q, q, torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout_p=0.1 is not supported"):
        fa.attention(q, q, q, None, 0.1)
    with pytest.raises(TypeError, match="dropout_p must be a float"):
        fa.attention(q, q, q, dropout_p="0")
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        fa.attention(q, q, q, enable_gqa=1)
    with pytest.raises(TypeError, match="on cpu"):  # SDPA's positional order: is_causal 6th
        fa.attention(q, q, q, None, 0.0, True, scale=0.5, enable_gqa=False)
    with pytest.raises(TypeError):  # scale and enable_gqa are keyword-only, as in SDPA
        fa.attention(q, q, q, None, 0.0, True, 0.5)


def test_shapes_and_flags(torch, fa):
    q, v = _t(torch, 2, 8, 64), _t(torch, 2, 8, 64)
    with pytest.raises(ValueError, match="k has shape"):
        fa.attention(q, _t(torch, 2, 8, 32), v)
    with pytest.raises(TypeError, match="causal"):
        fa.attention(q, q, v, is_causal="yes")
    with pytest.raises(TypeError, match="share one dtype"):
        fa.attention(q, _t(torch, 2, 8, 64, dtype="bfloat16"), v)


# On the GPU


def _inputs(torch, dtype, lead, Nq, Nk, d):
    seed = zlib.crc32(repr((dtype, lead, Nq, Nk, d)).encode())
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    shapes = [(*lead, Nq, d), (*lead, Nk, d), (*lead, Nk, d), (*lead, Nq, d)]
    return [torch.randn(s, generator=g).to(dt).cuda() for s in shapes]  # q, k, v, dO


def _grads(torch, fn, q, k, v, dO, dtype=None):
    """(O, dq, dk, dv) of fn at the given inputs (cast to dtype), for upstream gradient dO."""
    dtype = dtype or q.dtype
    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    O = fn(*leaves)
    O.backward(dO.to(dtype))
    return [O.detach()] + [x.grad for x in leaves]


def _sdpa(torch, backend, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    def fn(q, k, v):
        if backend is None:  # torch's own choice for this dtype and shape
            return scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def _naive(torch, causal):
    def fn(q, k, v):  # every step in q's dtype, as a plain implementation would do it
        S = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (..., Nq, Nk)
        if causal:
            allowed = torch.ones(S.shape[-2:], dtype=torch.bool, device=S.device).tril()
            S = S.masked_fill(~allowed, float("-inf"))
        return torch.softmax(S, dim=-1) @ v  # (..., Nq, d)

    return fn


def _error(torch, x, ref):
    """(max |x - ref| / max |ref|, index of the worst element); NaN anywhere gives NaN."""
    x, ref = x.double(), ref.double()
    diff = (x - ref).abs()
    if torch.isnan(diff).any():
        return float("nan"), tuple(torch.nonzero(torch.isnan(diff))[0].tolist())
    worst = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    size = ref.abs().max().item()
    return diff.max().item() / (size if size > 0 else 1.0), worst


def _compare(torch, case, got, yard, ref, what):
    dtype, d, causal, lead, Nq, Nk = case
    problems = []
    for name, g, y, r in zip(("O", "dq", "dk", "dv"), got, yard, ref, strict=True):
        err, where = _error(torch, g, r)
        base, _ = _error(torch, y, r)
        assert base <= YARDSTICK_MAX, f"{_id(case)}: {name}: the yardstick's error is {base}"
        tol = 2 * base + FLOOR[dtype]
        if not err <= tol:  # NaN fails
            problems.append(
                f"{name} of shape {tuple(g.shape)}: error {err:.3g} at {where} "
                f"(flashref {g[where].item():.6g}, reference {r[where].item():.6g}) > tolerance "
                f"{tol:.3g} = 2 x {what} {base:.3g} + floor {FLOOR[dtype]:g}"
            )
    assert not problems, f"{_id(case)}:\n" + "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_forward_and_gradients_against_sdpa_float32(torch, fa, case):
    dtype, d, causal, lead, Nq, Nk = case
    q, k, v, dO = _inputs(torch, dtype, lead, Nq, Nk, d)
    got = _grads(torch, lambda *x: fa.attention(*x, is_causal=causal), q, k, v, dO)
    if Nq == Nk:
        yard, what = _grads(torch, _sdpa(torch, None, causal), q, k, v, dO), "SDPA's"
    else:
        yard, what = _grads(torch, _naive(torch, causal), q, k, v, dO), "naive attention's"
    ref = _grads(torch, _sdpa(torch, "MATH", causal), q, k, v, dO, dtype=torch.float32)
    _compare(torch, case, got, yard, ref, f"{what} {dtype} error")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gradients_against_float64_like_gradcheck(torch, fa, case):
    dtype, d, causal, lead, Nq, Nk = case
    q, k, v, dO = _inputs(torch, dtype, lead, Nq, Nk, d)
    got = _grads(torch, lambda *x: fa.attention(*x, is_causal=causal), q, k, v, dO)
    yard = _grads(torch, _naive(torch, causal), q, k, v, dO)
    ref = _grads(torch, _sdpa(torch, "MATH", causal), q, k, v, dO, dtype=torch.float64)
    _compare(torch, case, got, yard, ref, f"naive {dtype} attention's error")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_transposed_views_are_copied_once_and_contiguous_inputs_not_at_all(torch, fa, dtype):
    B, N, H, d = 2, 130, 3, 64
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn((B, N, 3, H, d), generator=g).to(dt).cuda()  # as a model's projection
    dO = torch.randn((B, H, N, d), generator=g).to(dt).cuda()
    views = [qkv[:, :, i].transpose(1, 2).requires_grad_() for i in range(3)]  # (B, H, N, d)
    assert not any(x.is_contiguous() for x in views)
    dense = [x.detach().contiguous().requires_grad_() for x in views]
    O_view = fa.attention(*views, is_causal=True)
    O_dense = fa.attention(*dense, is_causal=True)
    saved = O_dense.grad_fn.saved_tensors  # q, k, v, O, lse
    assert [s.data_ptr() for s in saved[:3]] == [x.data_ptr() for x in dense], "inputs copied"
    assert saved[3].data_ptr() == O_dense.data_ptr(), "the output was copied"
    assert saved[4].dtype == torch.float32 and saved[4].shape == (B, H, N)
    assert all(s.is_contiguous() for s in O_view.grad_fn.saved_tensors[:3])
    assert torch.equal(O_view, O_dense), "the forward of a view differs from its copy's"
    O_view.backward(dO)
    O_dense.backward(dO)
    for name, a, b in zip(("dq", "dk", "dv"), views, dense, strict=True):
        err, where = _error(torch, a.grad, b.grad)
        assert err <= FLOOR[dtype], f"{name}: view and copy differ by {err:.3g} at {where}"


@pytest.mark.gpu
def test_a_transposed_gradient_takes_the_direct_route(torch, fa, monkeypatch):
    # a model's attention output goes through transpose(1, 2).reshape(...), so the dO its
    # backward receives is a transposed view: the adapter copies it once and launches the
    # kernels directly, as for a contiguous dO (the general route costs far more host time)
    from flashref.gpu import backward as gpu_backward

    B, N, H, d = 2, 130, 3, 64
    g = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn((B, H, N, d), generator=g).half().cuda().requires_grad_() for _ in range(3)
    )
    dO_dense = torch.randn((B, H, N, d), generator=g).half().cuda()
    dO_view = dO_dense.transpose(1, 2).contiguous().transpose(1, 2)  # same values, transposed
    assert not dO_view.is_contiguous() and torch.equal(dO_view, dO_dense)

    def general(self, arrays):
        raise AssertionError("the backward took its general route")

    want = torch.autograd.grad(fa.attention(q, k, v, is_causal=True), (q, k, v), dO_dense)
    monkeypatch.setattr(gpu_backward._BwdPlan, "_general", general)
    got = torch.autograd.grad(fa.attention(q, k, v, is_causal=True), (q, k, v), dO_view)
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        err, where = _error(torch, a, b)
        assert err <= FLOOR["float16"], f"{name}: a transposed dO differs by {err:.3g}"


@pytest.mark.gpu
def test_gradients_only_where_required(torch, fa):
    q, k, v, dO = _inputs(torch, "float16", (1, 2), 70, 70, 64)
    full = _grads(torch, lambda *x: fa.attention(*x), q, k, v, dO)
    qg = q.clone().requires_grad_()
    kk, vv = k.clone(), v.clone()
    fa.attention(qg, kk, vv).backward(dO)
    assert kk.grad is None and vv.grad is None
    err, where = _error(torch, qg.grad, full[1])
    assert err <= FLOOR["float16"], f"dq alone differs from dq of all three by {err:.3g}"
    with torch.no_grad():
        O = fa.attention(q.clone().requires_grad_(), k, v)
    assert O.grad_fn is None and not O.requires_grad
    assert torch.equal(O, full[0])


@pytest.mark.gpu
def test_cuda_tensors_on_another_stream(torch, fa):
    q, k, v, dO = _inputs(torch, "bfloat16", (2, 2), 300, 300, 128)
    want = _grads(torch, lambda *x: fa.attention(*x, is_causal=True), q, k, v, dO)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = _grads(torch, lambda *x: fa.attention(*x, is_causal=True), q, k, v, dO)
    torch.cuda.current_stream().wait_stream(side)
    for name, a, b in zip(("O", "dq", "dk", "dv"), got, want, strict=True):
        err, where = _error(torch, a, b)
        assert err <= FLOOR["bfloat16"], f"{name} on a side stream differs by {err:.3g}"
