"""The forward pass on the GPU: ``flash_attention`` and the checks it makes before a launch.

The tiled algorithm of ``flashref.tiled_attention`` written in CUDA C, in numbered versions
that change one thing at a time (``forward_versions.VERSIONS``; the sources are
``flashref/kernels/forward/`` (``mma.sync``) and ``flashref/kernels/hopper/`` (``wgmma``,
sm_90a)), compiled at run time by NVRTC through CuPy (``_launch``):

    from flashref.gpu import flash_attention
    O = flash_attention(q, k, v, causal=True)  # q, k, v: cupy arrays (..., N, d)

Conventions are those of ``flashref.tiled_attention``: ``scale`` defaults to
``1/sqrt(d)``, causal masking is aligned top-left (query i sees keys j <= i),
Nq may differ from Nk, a query that sees no key gets zeros and ``lse = -inf``,
and ``return_lse=True`` also returns the natural-log log-sum-exp in float32.
"""

from __future__ import annotations

import numbers

from ._runtime import (
    DTYPES,
    _check_capability,
    _check_inputs,
    _device_cc,
    _is_torch,
    _require_gpu,
    _to_cupy,
)
from .forward_versions import VERSIONS, Version, default_forward_version


def _check_version(version, dtype: str, d: int, causal: bool = False, cc=None) -> Version:
    """The version to run: ``version`` checked against the dtype and d, or for None the
    default (``default_forward_version``) on a GPU of compute capability ``cc`` (None: any
    GPU's)."""
    if version is None:
        number = default_forward_version(dtype, d, causal, cc)
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


def _decode_route(q, k, G: int, dtype: str, causal: bool, version) -> bool:
    """Whether grouped heads go to the decode kernel (``decode.py``), which reads each K/V
    head once for all its query heads: 4-D inputs of at most 16 queries, 16-bit, d 64 or 128,
    no version asked for, and causal only where top-left and the decode kernel's bottom-right
    alignment agree (Nq == Nk). Other grouped inputs run a numbered version once per group
    member (``_launch.launch_grouped``)."""
    from .decode.checks import HEAD_DIMS, MAX_NQ

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
