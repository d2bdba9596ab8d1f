"""flashref's kernels as a PyTorch operation with a gradient (optional: needs torch).

    import flashref.torch
    y = flashref.torch.attention(q, k, v, causal=True)  # like F.scaled_dot_product_attention
    y.sum().backward()  # q.grad, k.grad, v.grad from flashref.gpu.flash_attention_backward

``FlashAttention`` is a ``torch.autograd.Function``: its forward runs
``flashref.gpu.flash_attention`` with ``return_lse=True`` and saves ``q, k, v, O, lse``
for its backward, which runs ``flashref.gpu.flash_attention_backward``. The tensors go to
and from the kernels through DLPack, so nothing is copied on the way, and every kernel is
launched on torch's current CUDA stream, so it is ordered with the model's other work.

Nothing else in flashref imports this module, and torch is required by nothing else:
importing it without torch installed is an ImportError that says so.
"""

from __future__ import annotations

try:
    import torch
except ImportError as exc:
    raise ImportError(
        "flashref.torch needs PyTorch, and the package 'torch' is not installed "
        f"({exc}); install a CUDA build of torch (https://pytorch.org), or use "
        "flashref.gpu.flash_attention with CuPy arrays, which needs no torch"
    ) from exc

from contextlib import contextmanager

from . import gpu
from .gpu import _runtime

# What flashref.gpu.flash_attention_backward takes (the forward takes more: float32, other d).
BACKWARD_DTYPES = ("float16", "bfloat16")
BACKWARD_HEAD_DIMS = (64, 128)


@contextmanager
def _on_torch_stream(device: torch.device):
    """CuPy's current device and stream set to torch's for ``device`` while inside."""
    cp = _runtime._require_gpu()
    stream = torch.cuda.current_stream(device)
    with cp.cuda.Device(device.index), cp.cuda.ExternalStream(stream.cuda_stream, device.index):
        yield


class FlashAttention(torch.autograd.Function):
    """``softmax(scale * q k^T) v`` by flashref's kernels, with their backward pass.

    Takes checked, C-contiguous torch CUDA tensors ``q (..., Nq, d)``, ``k, v (..., Nk, d)``
    of one dtype; call it through ``attention``, which checks and prepares them.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float | None):
        with _on_torch_stream(q.device):
            O, lse = gpu.flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True)
        ctx.save_for_backward(q, k, v, O, lse)  # O (..., Nq, d), lse float32 (..., Nq)
        ctx.causal, ctx.scale = causal, scale
        return O

    @staticmethod
    def backward(ctx, dO):
        q, k, v, O, lse = ctx.saved_tensors
        dO = dO.contiguous()  # (..., Nq, d); autograd may hand over an expanded view
        with _on_torch_stream(q.device):
            dq, dk, dv = gpu.flash_attention_backward(
                q, k, v, O, lse, dO, causal=ctx.causal, scale=ctx.scale
            )
        wanted = ctx.needs_input_grad
        return (
            dq if wanted[0] else None,
            dk if wanted[1] else None,
            dv if wanted[2] else None,
            None,  # causal
            None,  # scale
        )


def _check(q, k, v, causal, scale) -> None:
    """Every check, before any work: the forward's, the backward's limits, tensors, devices."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    dtype, d, _, _ = _runtime._check_inputs(q, k, v, causal, scale, False)  # shapes, dtypes, flags
    grads = [name for name, x in (("q", q), ("k", k), ("v", v)) if x.requires_grad]
    if grads and torch.is_grad_enabled():
        if dtype not in BACKWARD_DTYPES:
            raise TypeError(
                f"{grads[0]} requires grad but has dtype {dtype}; flashref's backward "
                f"kernels take {' or '.join(BACKWARD_DTYPES)} (cast, or use torch.no_grad())"
            )
        if d not in BACKWARD_HEAD_DIMS:
            raise ValueError(
                f"{grads[0]} requires grad but q has head dim d={d}; flashref's backward "
                f"kernels take d in {BACKWARD_HEAD_DIMS}"
            )
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not x.is_cuda:
            raise TypeError(f"{name} is a torch tensor on {x.device}; move it to the GPU first")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}; use one device")


def attention(q, k, v, *, causal=False, scale=None):
    """Attention of torch CUDA tensors by flashref's kernels, differentiable.

    Called as ``F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)``
    without a mask or dropout: ``q (..., Nq, d)``, ``k (..., Nk, d)``, ``v (..., Nk, d)`` of
    one dtype (float16 or bfloat16; float32 forward only), ``causal`` aligned top-left (query
    i sees keys j <= i, as SDPA's ``is_causal``), ``scale`` default ``1/sqrt(d)``. Returns
    ``(..., Nq, d)`` in q's dtype.

    The kernels read C-contiguous memory. An input that is not (a transposed view, as a
    model's ``(B, N, H, d) -> (B, H, N, d)`` produces) is copied once, here, with
    ``.contiguous()``; that copy is what the backward reads too, so nothing is copied twice.
    Contiguous inputs are not copied. Gradients are computed by the backward kernel and
    returned only for the inputs that require them; with grad enabled for any input, the
    dtype and head dim must be ones the backward takes (checked here, before any work).
    """
    _check(q, k, v, causal, scale)
    q, k, v = (x.contiguous() for x in (q, k, v))  # a no-op for contiguous tensors
    return FlashAttention.apply(q, k, v, bool(causal), scale)


__all__ = ["BACKWARD_DTYPES", "BACKWARD_HEAD_DIMS", "FlashAttention", "attention"]
