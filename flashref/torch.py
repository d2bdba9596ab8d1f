"""flashref's kernels as a PyTorch operation with a gradient (optional: needs torch).

    import flashref.torch
    y = flashref.torch.attention(q, k, v, is_causal=True)  # F.scaled_dot_product_attention's call
    y.sum().backward()  # q.grad, k.grad, v.grad from flashref.gpu.flash_attention_backward

Two custom operators, registered with ``torch.library.custom_op``:

* ``flashref::attention_forward(q, k, v, is_causal, scale) -> (O, lse)`` runs
  ``flashref.gpu.flash_attention`` with ``return_lse=True``;
* ``flashref::attention_backward(dO, q, k, v, O, lse, is_causal, scale) -> (dq, dk, dv)``
  runs ``flashref.gpu.flash_attention_backward``;

each with a fake (meta) function, so that ``torch.compile(model, fullgraph=True)`` traces a
model that calls them without a graph break, and the forward with its autograd formula (the
backward operator). The kernels read the tensors in place (no copy, no DLPack), run on
torch's current CUDA stream and allocate from torch's allocator, so a call is ordered with
the model's other work and can be captured by ``torch.cuda.graph`` or
``torch.compile(mode="reduce-overhead")``.

Nothing else in flashref imports this module, and torch is required by nothing else:
importing it without torch installed is an ImportError that says so.
"""

try:
    import torch
except ImportError as exc:
    raise ImportError(
        "flashref.torch needs PyTorch, and the package 'torch' is not installed "
        f"({exc}); install a CUDA build of torch (https://pytorch.org), or use "
        "flashref.gpu.flash_attention with CuPy arrays, which needs no torch"
    ) from exc

from . import gpu
from ._checks import check_sdpa_call
from .gpu import _host, _runtime
from .gpu.backward import backward_plan
from .gpu.forward import forward_plan

# What flashref.gpu.flash_attention_backward takes (the forward takes more: float32, other d).
BACKWARD_DTYPES = ("float16", "bfloat16")
BACKWARD_HEAD_DIMS = (64, 128)


@torch.library.custom_op("flashref::attention_forward", mutates_args=(), device_types="cuda")
def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(O, lse)`` of C-contiguous CUDA tensors: ``flashref.gpu.flash_attention``."""
    return gpu.flash_attention(q, k, v, causal=is_causal, scale=scale, return_lse=True)


@attention_forward.register_fake
def _(q, k, v, is_causal, scale):
    _check_tensors(q, k, v, is_causal, scale)  # at trace time, on the shapes the graph will see
    lead = q.shape[:-1]
    return q.new_empty((*lead, v.shape[-1])), q.new_empty(lead, dtype=torch.float32)


@torch.library.custom_op("flashref::attention_backward", mutates_args=(), device_types="cuda")
def attention_backward(
    dO: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    O: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)``: ``flashref.gpu.flash_attention_backward``."""
    return gpu.flash_attention_backward(
        q, k, v, O, lse, dO.contiguous(), causal=is_causal, scale=scale
    )


@attention_backward.register_fake
def _(dO, q, k, v, O, lse, is_causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, is_causal, scale = inputs
    O, lse = output
    ctx.save_for_backward(q, k, v, O, lse)  # O (..., Nq, d), lse float32 (..., Nq)
    ctx.is_causal, ctx.scale = is_causal, scale


def _backward(ctx, dO, dlse):
    q, k, v, O, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(dO, q, k, v, O, lse, ctx.is_causal, ctx.scale)
    wanted = ctx.needs_input_grad
    return (
        dq if wanted[0] else None,
        dk if wanted[1] else None,
        dv if wanted[2] else None,
        None,
        None,
    )


attention_forward.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The same forward and backward as the operators, for eager calls: a custom operator's
    dispatch costs more host time per call than a ``torch.autograd.Function``
    (``python -m flashref.bench calls`` measures both), and in eager mode nothing needs the
    operator. ``torch.compile`` traces the operators instead (``attention``)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, plan):
        if plan is None:  # attention found none kept for this signature
            plan = forward_plan(q, k, v, is_causal, scale, None, True)  # flash_attention's
        O, lse = plan.run(q, k, v, None)
        ctx.save_for_backward(q, k, v, O, lse)
        ctx.is_causal, ctx.scale = is_causal, scale
        # The backward's plan, kept beside the forward's (dO will have O's shape and dtype):
        # the backward runs on the autograd engine's thread and should only launch there.
        if any(ctx.needs_input_grad[:3]):
            if plan.backward is None:
                plan.backward = backward_plan((q, k, v, O, lse, O), is_causal, scale)
            ctx.plan = plan.backward
        return O

    @staticmethod
    def backward(ctx, dO):
        q, k, v, O, lse = ctx.saved_tensors
        if type(dO) is type(O):  # a tensor subclass goes through every check instead
            # The kernels read C-contiguous memory, and a model's (B, N, H, d) -> (B, H, N, d)
            # view hands back a transposed dO: copied once here, so that the plan launches
            # its kernels directly instead of taking its general route (CuPy views and
            # copies, several times the host time)
            dq, dk, dv = ctx.plan.run((q, k, v, O, lse, dO.contiguous()))
        else:
            dq, dk, dv = gpu.flash_attention_backward(
                q, k, v, O, lse, dO.contiguous(), causal=ctx.is_causal, scale=ctx.scale
            )
        wanted = ctx.needs_input_grad
        return (
            dq if wanted[0] else None,
            dk if wanted[1] else None,
            dv if wanted[2] else None,
            None,
            None,
            None,
        )


def _check_tensors(q, k, v, is_causal, scale) -> None:
    """Every check of the tensors, before any work: the forward's, the backward's limits
    where a gradient will be asked for, devices."""
    for name, x in (("query", q), ("key", k), ("value", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    dtype, d, _, _ = _runtime.check_inputs(q, k, v, is_causal, scale, False)
    grads = [name for name, x in (("query", q), ("key", k), ("value", v)) if x.requires_grad]
    if grads and torch.is_grad_enabled():
        if dtype not in BACKWARD_DTYPES:
            raise TypeError(
                f"{grads[0]} requires grad but has dtype {dtype}; flashref's backward "
                f"kernels take {' or '.join(BACKWARD_DTYPES)} (cast, or use torch.no_grad())"
            )
        if d not in BACKWARD_HEAD_DIMS:
            raise ValueError(
                f"{grads[0]} requires grad but query has head dim d={d}; flashref's backward "
                f"kernels take d in {BACKWARD_HEAD_DIMS}"
            )
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.device.type != "cuda":
            raise TypeError(f"{name} is a torch tensor on {x.device}; move it to the GPU first")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but query is on {q.device}; use one device")


_CHECKED = _host.Kept()  # the signatures _check_tensors passed, each with its forward plan


def _checked(q, k, v, is_causal, scale):
    """``_check_tensors``, run once per signature: every property it reads (types, shapes,
    dtypes, devices, which tensors require grad, whether grad mode is on) and the options
    with their types. A check that raised is not kept: bad input raises every time. Returns
    the forward's plan of the signature (``flash_attention``'s, kept with the check, so that
    a call looks up one key instead of two), or None where the key cannot be built."""
    try:
        key = (
            type(q),
            type(k),
            type(v),
            q.shape,
            k.shape,
            v.shape,
            q.dtype,
            k.dtype,
            v.dtype,
            q.get_device(),
            k.get_device(),
            v.get_device(),
            q.requires_grad,
            k.requires_grad,
            v.requires_grad,
            torch.is_grad_enabled(),
            type(is_causal),
            is_causal,
            type(scale),
            scale,
        )
        hash(key)
    except Exception:
        return _check_tensors(q, k, v, is_causal, scale)  # says what is wrong
    plan = _CHECKED.get(key)
    if plan is None:
        _check_tensors(q, k, v, is_causal, scale)
        scale = None if scale is None else float(scale)
        plan = _CHECKED.put(key, forward_plan(q, k, v, bool(is_causal), scale, None, True))
    return plan


def attention_op(query, key, value, is_causal=False, scale=None):
    """``attention`` through the custom operators in eager mode too (what ``torch.compile``
    traces): the same kernels and results, with the operators' dispatch cost (the benchmark
    of the calls times both routes)."""
    _check_tensors(query, key, value, is_causal, scale)
    q, k, v = (x.contiguous() for x in (query, key, value))
    return attention_forward(q, k, v, bool(is_causal), scale)[0]


def attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    *,
    scale=None,
    enable_gqa=False,
):
    """Attention of torch CUDA tensors by flashref's kernels, differentiable.

    Called as ``F.scaled_dot_product_attention``, positional arguments included (``scale``
    and ``enable_gqa`` keyword-only, as there):
    ``query (..., Nq, d)``, ``key (..., Nk, d)``, ``value (..., Nk, d)`` of one dtype
    (float16 or bfloat16; float32 forward only); ``is_causal`` aligned top-left (query ``i``
    sees keys ``j <= i``, as SDPA); ``scale`` default ``1/sqrt(d)``; grouped heads
    (``query (..., Hq, Nq, d)``, ``key``, ``value (..., Hkv, Nk, d)``, ``Hq`` a multiple of
    ``Hkv``) with ``enable_gqa=True``. ``attn_mask`` and a nonzero ``dropout_p`` are not
    implemented: a ``NotImplementedError`` naming the argument. Returns ``(..., Nq, d)`` in
    query's dtype.

    The kernels read C-contiguous memory. An input that is not (a transposed view, as a
    model's ``(B, N, H, d) -> (B, H, N, d)`` produces) is copied once, here, with
    ``.contiguous()``; that copy is what the backward reads too. Contiguous inputs are not
    copied. Gradients are returned only for the inputs that require them; with grad enabled
    for any input, the dtype and head dim must be ones the backward takes (checked here,
    before any work).
    """
    check_sdpa_call(query, key, attn_mask, dropout_p, is_causal, enable_gqa)
    compiling = torch.compiler.is_compiling()
    plan = None
    if not compiling:  # compiled: the fake function checks, at trace time
        plan = _checked(query, key, value, is_causal, scale)
    q, k, v = (x.contiguous() for x in (query, key, value))  # a no-op for contiguous tensors
    causal, scale = bool(is_causal), None if scale is None else float(scale)
    if compiling:
        return attention_forward(q, k, v, causal, scale)[0]
    return _EagerAttention.apply(q, k, v, causal, scale, plan)


__all__ = [
    "BACKWARD_DTYPES",
    "BACKWARD_HEAD_DIMS",
    "attention",
    "attention_backward",
    "attention_forward",
    "attention_op",
]
