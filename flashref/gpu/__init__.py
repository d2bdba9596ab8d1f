"""FlashAttention forward kernels for NVIDIA GPUs, as CuPy RawKernels.

The tiled algorithm of ``flashref.tiled_attention`` written in CUDA C, in
numbered versions that change one thing at a time (``VERSIONS``; the sources
are ``flashref/kernels/v*.cu``, compiled at run time by NVRTC through CuPy):

    from flashref.gpu import flash_attention
    O = flash_attention(q, k, v, causal=True)  # q, k, v: cupy arrays (..., N, d)

Conventions are those of ``flashref.tiled_attention``: ``scale`` defaults to
``1/sqrt(d)``, causal masking is aligned top-left (query i sees keys j <= i),
Nq may differ from Nk, a query that sees no key gets zeros and ``lse = -inf``,
and ``return_lse=True`` also returns the natural-log log-sum-exp in float32.

CuPy is imported only when a kernel is called, so ``import flashref.gpu``
works on any machine; calling without CuPy or without a GPU raises
``GPUUnavailableError`` saying what is missing and how to install it.
"""

from __future__ import annotations

import numbers

from .._checks import check_flag, check_scale, check_shapes
from .versions import HOPPER_PREFERENCE, KERNEL_DIR, PREFERENCE, VERSIONS, Version, default_version

INSTALL_HINT = (
    "install CuPy for your CUDA driver with pip install 'flashref[cuda12]' "
    "(CUDA 12.x driver) or pip install 'flashref[cuda13]' (CUDA 13.x driver)"
)


class GPUUnavailableError(RuntimeError):
    """Raised when a kernel is called on a machine without CuPy or without a CUDA GPU."""


DTYPES = ("float16", "bfloat16", "float32")


def gpu_unavailable_reason() -> str | None:
    """None if CuPy is installed and sees a CUDA GPU; otherwise what is missing, in words."""
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); {INSTALL_HINT}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, driver too old for this CuPy, no device node ...
        return (
            f"CuPy cannot reach a CUDA GPU ({type(exc).__name__}: {exc}); flashref.gpu needs "
            f"an NVIDIA GPU with a working driver and the matching CuPy: {INSTALL_HINT}"
        )
    if count < 1:
        return "CUDA reports no GPU on this machine; flashref.gpu needs an NVIDIA GPU"
    return None


def available() -> bool:
    """True when the kernels can run here (CuPy installed, a CUDA GPU visible)."""
    return gpu_unavailable_reason() is None


def _require_gpu():
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise GPUUnavailableError(f"flashref.gpu cannot run: {reason}")
    import cupy

    return cupy


def _check_version(version, dtype: str, d: int, causal: bool = False, cc=None) -> Version:
    """The version to run: ``version`` checked against the dtype and d, or for None the
    default (``default_version``) on a GPU of compute capability ``cc`` (None: any GPU's)."""
    if version is None:
        number = default_version(dtype, d, causal, cc)
        if number is not None:
            return VERSIONS[number]
        dims = sorted({x for v in VERSIONS.values() if dtype in v.dtypes for x in v.head_dims})
        if not dims:
            raise ValueError(f"q has dtype {dtype}; flashref.gpu supports {', '.join(DTYPES)}")
        text = f"{dims[0]}..{dims[-1]}" if len(dims) > 8 else ", ".join(map(str, dims))
        raise ValueError(f"q has head dim d={d}; the {dtype} kernels support d in {text}")
    if isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise TypeError(f"version must be an int or None, got {type(version).__name__}")
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {sorted(VERSIONS)} or None, got {version}")
    v = VERSIONS[int(version)]
    if dtype not in v.dtypes:
        others = [n for n, w in VERSIONS.items() if dtype in w.dtypes]
        raise ValueError(
            f"version {v.number} ({v.name}) takes {' or '.join(v.dtypes)} inputs but q is "
            f"{dtype}; use version {others} or convert with q.astype('{v.dtypes[0]}')"
        )
    if d not in v.head_dims:
        dims = f"{v.head_dims[0]}..{v.head_dims[-1]}" if len(v.head_dims) > 8 else v.head_dims
        raise ValueError(f"q has head dim d={d}; version {v.number} supports d in {dims}")
    return v


def _device_cc(cp) -> tuple[int, int]:
    """The current device's compute capability as (major, minor)."""
    major, minor = divmod(int(cp.cuda.Device().compute_capability), 10)
    return major, minor


def _check_capability(cp, ver: Version) -> None:
    """The version's instructions must exist on this GPU: a clear error, not an NVRTC failure."""
    dev = cp.cuda.Device()
    cc = _device_cc(cp)
    if not ver.runs_on(cc):
        name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
        what = f"{getattr(ver, 'kind', '')}version {ver.number} ({ver.name})"
        if ver.arch:
            raise RuntimeError(
                f"{what} is built for {ver.arch} and needs compute "
                f"capability {ver.min_cc[0]}.{ver.min_cc[1]} exactly; this GPU ({name}) has "
                f"{cc[0]}.{cc[1]}"
            )
        raise RuntimeError(
            f"{what} needs compute capability "
            f"{ver.min_cc[0]}.{ver.min_cc[1]} or higher; this GPU ({name}) has {cc[0]}.{cc[1]}"
        )


def _dtype_name(x) -> str:
    """'float16', 'bfloat16', ... for CuPy arrays and torch tensors alike."""
    return str(x.dtype).removeprefix("torch.")


def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def _check_inputs(q, k, v, causal, scale, return_lse):
    """Shape, dtype and argument checks that need no GPU; returns (dtype, d, scale, G).

    ``causal``, ``return_lse`` and ``scale`` follow the NumPy functions' rules
    (``check_flag``, ``check_scale``); the kernels accumulate in float32. ``G = Hq // Hkv``
    is the grouped-query group size (1 without grouping), under the NumPy functions' rules.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "ndim")):
            raise TypeError(
                f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}"
            )
    G = check_shapes(q, k, v)  # the same shape rules, and messages, as the NumPy functions
    d = q.shape[-1]
    if v.shape[-1] != d:
        raise ValueError(
            f"v has shape {tuple(v.shape)}; these kernels need v's head dim equal to q's, {d}"
        )
    dtypes = {_dtype_name(x) for x in (q, k, v)}
    if len(dtypes) != 1:
        raise TypeError(
            f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype} (no implicit casts)"
        )
    dtype = dtypes.pop()
    if dtype not in DTYPES:
        raise TypeError(f"q has dtype {dtype}; flashref.gpu supports {', '.join(DTYPES)}")
    check_flag(causal, "causal")
    check_flag(return_lse, "return_lse")
    return dtype, d, check_scale(scale, d, "float32"), G


def _decode_route(q, k, G: int, dtype: str, causal: bool, version) -> bool:
    """Whether grouped heads go to the decode kernel (``decode.py``), which reads each K/V
    head once for all its query heads: 4-D inputs of at most 16 queries, 16-bit, d 64 or 128,
    no version asked for, and causal only where top-left and the decode kernel's bottom-right
    alignment agree (Nq == Nk). Other grouped inputs run a numbered version once per group
    member (``_launch.launch_grouped``)."""
    from .decode import HEAD_DIMS, MAX_NQ

    Nq, Nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    return (
        G > 1
        and q.ndim == 4
        and 1 <= Nq <= MAX_NQ
        and dtype != "float32"
        and d in HEAD_DIMS
        and version is None
        and (not causal or Nq == Nk)
    )


def _to_cupy(cp, x, name: str):
    """A CuPy view of ``x``: a CuPy array as it is, a torch CUDA tensor through DLPack (no copy)."""
    if isinstance(x, cp.ndarray):
        return x
    if _is_torch(x):
        if not x.is_cuda:
            raise TypeError(f"{name} is a torch tensor on {x.device}; move it to the GPU first")
        return cp.from_dlpack(x.detach())
    raise TypeError(
        f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__} "
        "(use cupy.asarray)"
    )


def flash_attention(q, k, v, *, causal=False, scale=None, version=None, return_lse=False, out=None):
    """Attention ``softmax(scale * Q K^T) V`` on the GPU, tiled FlashAttention style.

    Args:
        q: (..., Nq, d); k: (..., Nk, d); v: (..., Nk, d); CuPy arrays or torch CUDA tensors
            (taken through DLPack without a copy), one dtype: float16 or bfloat16 (the
            tensor-core versions) or float32 (versions 1 and 2). CuPy holds bfloat16 as
            ``ml_dtypes.bfloat16``.
        Grouped K/V heads: ``q (..., Hq, Nq, d)`` with ``k``, ``v (..., Hkv, Nk, d)`` and
            ``Hq`` a multiple of ``Hkv`` (query head ``h`` uses K/V head ``h // (Hq // Hkv)``),
            without copying K/V. 16-bit 4-D inputs with ``Nq <= 16``, d 64 or 128 and
            ``version=None`` (causal only with ``Nq == Nk``) run the decode kernel
            (``flashref.gpu.decode_attention``); other grouped inputs run the version once per
            member of a group.
        causal: top-left causal mask (query i sees keys j <= i); a bool.
        scale: score scale, default ``1/sqrt(d)``; a real number, finite, nonzero
            and within float32's range (negative allowed), as on the CPU.
        version: a key of ``VERSIONS``, or None for the fastest that supports
            the dtype and head dim.
        return_lse: a bool; also return ``lse (..., Nq)`` in float32.
        out: optional contiguous array (..., Nq, d) of q's dtype and kind to write O into.

    Returns ``O (..., Nq, d)`` in q's dtype, or ``(O, lse)``; torch tensors if q is one.
    """
    dtype, d, scale, G = _check_inputs(q, k, v, causal, scale, return_lse)
    causal = bool(causal)  # a NumPy bool passed check_flag
    ver = _check_version(version, dtype, d, causal)
    cp = _require_gpu()
    torch_in = _is_torch(q)
    q, k, v = (_to_cupy(cp, x, name) for name, x in (("q", q), ("k", k), ("v", v)))
    if version is None:  # the default of this GPU's compute capability (HOPPER_PREFERENCE)
        ver = _check_version(None, dtype, d, causal, _device_cc(cp))
    _check_capability(cp, ver)
    lead, Nq = tuple(q.shape[:-2]), q.shape[-2]
    if out is not None:
        usable = _is_torch(out) or isinstance(out, cp.ndarray)
        out_cp = _to_cupy(cp, out, "out") if usable else None
        if out_cp is None or out_cp.shape != (*lead, Nq, d) or out_cp.dtype != q.dtype:
            raise ValueError(
                f"out must be an array of shape {(*lead, Nq, d)} and dtype {dtype}, got "
                f"{type(out).__name__} {getattr(out, 'shape', '')} {getattr(out, 'dtype', '')}"
            )
        if not out_cp.flags.c_contiguous:
            raise ValueError("out must be C-contiguous")
        O = out_cp
    else:
        O = cp.empty((*lead, Nq, d), dtype=q.dtype)
    lse = cp.empty((*lead, Nq), dtype=cp.float32)

    if _decode_route(q, k, G, dtype, causal, version):  # split as choose_num_splits says
        from .decode import decode_attention

        causal_br = "bottom_right" if causal else False  # the same mask here (Nq == Nk)
        O[...], lse[...] = decode_attention(q, k, v, causal=causal_br, scale=scale, return_lse=True)
    elif G != 1:
        from ._launch import launch_grouped

        launch_grouped(ver, q, k, v, O, lse, G=G, causal=causal, scale=scale)
    else:
        from ._launch import launch

        launch(ver, q, k, v, O, lse, causal=causal, scale=scale)
    if torch_in:
        import torch

        O_t = out if out is not None else torch.from_dlpack(O)
        return (O_t, torch.from_dlpack(lse)) if return_lse else O_t
    if out is not None:
        O = out
    return (O, lse) if return_lse else O


from .backward import flash_attention_backward  # noqa: E402  (uses the helpers above)
from .bwd_versions import BWD_VERSIONS, BwdVersion  # noqa: E402
from .decode import (  # noqa: E402 (it uses _require_gpu and _to_cupy, defined above)
    cache_decode_attention,
    choose_num_splits,
    decode_attention,
    decode_plan,
    paged_decode_attention,
)

__all__ = [
    "BWD_VERSIONS",
    "BwdVersion",
    "DTYPES",
    "GPUUnavailableError",
    "KERNEL_DIR",
    "HOPPER_PREFERENCE",
    "PREFERENCE",
    "VERSIONS",
    "Version",
    "available",
    "cache_decode_attention",
    "choose_num_splits",
    "decode_attention",
    "decode_plan",
    "flash_attention",
    "flash_attention_backward",
    "gpu_unavailable_reason",
    "paged_decode_attention",
]
