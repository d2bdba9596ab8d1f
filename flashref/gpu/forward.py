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

import math
import numbers

import numpy as np

from . import _host
from ._host import backend_of
from ._runtime import (
    DTYPES,
    check_capability,
    check_inputs,
    device_cc,
    require_gpu,
)
from .decode.checks import HEAD_DIMS, MAX_NQ
from .forward_versions import VERSIONS, Version, default_forward_version


def resolve_version(version, dtype: str, d: int, causal: bool = False, cc=None) -> Version:
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
            (read in place: no copy, no DLPack; a torch call runs on torch's current stream
            and allocates from torch's allocator, so it can be captured by
            ``torch.cuda.graph``; a CuPy call runs on CuPy's current stream), one dtype:
            float16 or bfloat16 (the tensor-core versions) or float32 (versions 1 and 2).
            CuPy holds bfloat16 as ``ml_dtypes.bfloat16``. Grouped K/V heads:
            ``q (..., Hq, Nq, d)`` with ``k``, ``v (..., Hkv, Nk, d)`` and ``Hq`` a multiple
            of ``Hkv`` (query head ``h`` uses K/V head ``h // (Hq // Hkv)``), without copying
            K/V. 16-bit 4-D inputs with ``Nq <= 16``, d 64 or 128 and ``version=None``
            (causal only with ``Nq == Nk``) run the decode kernel
            (``flashref.gpu.decode_attention``); other grouped inputs run the version once
            per member of a group.
        causal: ``False``, ``True`` or ``"top_left"`` (query i sees keys j <= i); the
            kernels mask top-left, so ``"bottom_right"`` is taken where it is the same mask
            (``Nq == Nk``) and refused elsewhere (``flashref._checks.check_causal``).
        scale: score scale, default ``1/sqrt(d)``; a real number, finite, nonzero
            and within float32's range (negative allowed), as on the CPU.
        version: a key of ``VERSIONS``, or None for the fastest that supports
            the dtype and head dim.
        return_lse: a bool; also return ``lse (..., Nq)`` in float32.
        out: optional contiguous array (..., Nq, d) of q's dtype and kind to write O into.

    Returns ``O (..., Nq, d)`` in q's dtype, or ``(O, lse)``; torch tensors if q is one.
    """
    plan = forward_plan(q, k, v, causal, scale, version, return_lse)
    O, lse = plan.run(q, k, v, out)
    return (O, lse) if return_lse else O


_PLANS = _host.Kept()  # call signature -> _Plan


def forward_plan(q, k, v, causal=False, scale=None, version=None, return_lse=False) -> _Plan:
    """The checked plan of this call signature (``_host.signature``): made (every check)
    once, then looked up."""
    key = _host.signature((q, k, v), (causal, scale, version, return_lse))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, _Plan(q, k, v, causal, scale, version, return_lse))
    return plan


class _Plan(_host.Plan):
    """One call signature, checked: the version, the route, and for the direct route the
    compiled kernel with its grid and scalar arguments, so that a call only reads the
    arrays' addresses, allocates the outputs and launches."""

    def __init__(self, q, k, v, causal, scale, version, return_lse):
        dtype, d, scale, G = check_inputs(q, k, v, causal, scale, return_lse)
        causal = bool(causal)  # truthy exactly where it masks (check_inputs)
        ver = resolve_version(version, dtype, d, causal)
        cp = require_gpu()
        super().__init__(cp, backend_of(cp, (("q", q), ("k", k), ("v", v))))
        with self.backend.scope():
            if version is None:  # the default of this GPU's compute capability
                ver = resolve_version(None, dtype, d, causal, device_cc(cp))
            check_capability(cp, ver)
        self.ver, self.dtype, self.d, self.scale, self.causal, self.G = (
            ver,
            dtype,
            d,
            scale,
            causal,
            G,
        )
        self.version = version
        self.backward = None  # the backward's plan for this signature (flashref.torch keeps it)
        self.lead, self.Nq, self.Nk = tuple(q.shape[:-2]), q.shape[-2], k.shape[-2]
        self.o_shape, self.lse_shape = (*self.lead, self.Nq, d), (*self.lead, self.Nq)
        self.decode = _decode_route(q, k, G, dtype, causal, version)
        BH = math.prod(self.lead)
        self.direct = (
            not self.decode and G == 1 and BH > 0 and self.Nq > 0 and self.Nk > 0 and scale > 0
        )
        if self.direct:
            self._prepare(BH)

    def _prepare(self, BH: int) -> None:
        from . import _launch

        if BH > _launch.MAX_GRID_Y:
            self.direct = False  # chunks along blockIdx.y: the general route
            return
        ver, d = self.ver, self.d
        with self.on_device():
            self.fn = _launch.get_function(ver, d, self.dtype)
            sms = _launch.sm_count() if ver.persistent else 1
        if _launch.MAX_PERSISTENT_BLOCKS is not None:
            sms = min(sms, _launch.MAX_PERSISTENT_BLOCKS)
        self.grid, self.block, self.smem = (
            _host.dims3(ver.grid(self.Nq, BH, sms)),
            _host.dims3((ver.threads,)),
            ver.smem_bytes(d),
        )
        self.scalars = (
            np.int32(self.Nq),
            np.int32(self.Nk),
            np.float32(self.scale),
            np.int32(self.causal),
        )
        self.heads = (np.int32(BH),) if ver.persistent else ()
        self.tma = bool(ver.tma)
        if self.tma:
            self.map_rows = (
                (BH * self.Nq, 64),
                (BH * self.Nk, ver.Bc(d)),
                (BH * self.Nk, ver.Bc(d)),
            )
        self.map_of = _launch.tensor_map_ptr  # the cached TMA descriptors (bytes)

    def _check_out(self, out, q):
        b = self.backend
        ok = _host.is_torch(out) if b.kind == "torch" else isinstance(out, self.cp.ndarray)
        if not ok or tuple(out.shape) != self.o_shape or out.dtype != q.dtype:
            raise ValueError(
                f"out must be an array of shape {self.o_shape} and dtype {self.dtype} (the kind "
                f"of q), got {type(out).__name__} {tuple(getattr(out, 'shape', ()))} "
                f"{getattr(out, 'dtype', '')}"
            )
        if b.kind == "torch":
            _host.check_torch_tensors((("q", q), ("out", out)))
        if not b.contiguous(out):
            raise ValueError("out must be C-contiguous")

    def run(self, q, k, v, out):
        """``(O, lse)`` of checked inputs of this signature."""
        b = self.backend
        if out is not None:
            self._check_out(out, q)
        ptrs = self.addresses((q, k, v)) if self.direct else None  # the 16-byte loads
        if ptrs is None:
            return self._general(q, k, v, out)
        O = out if out is not None else b.empty(self.o_shape, q.dtype)
        lse = b.empty(self.lse_shape, "float32")
        maps = ()
        if self.tma:
            map_of, d, dt, dev = self.map_of, self.d, self.dtype, self.device
            (rq, bq), (rk, bk), (rv, bv) = self.map_rows
            maps = (
                map_of(ptrs[0], rq, d, dt, bq, dev),
                map_of(ptrs[1], rk, d, dt, bk, dev),
                map_of(ptrs[2], rv, d, dt, bv, dev),
            )
        args = (*ptrs, b.ptr(O), b.ptr(lse), *self.scalars, *maps, *self.heads)
        with self.on_device():
            self.launch(self.fn, self.grid, self.block, self.smem, b.stream_ptr(), args)
        return O, lse

    def _general(self, q, k, v, out):
        """Grouped heads, the decode route, a negative scale, empty shapes, inputs to copy
        first: written with CuPy operations, run inside the backend's scope (torch's stream
        and allocator for torch tensors)."""
        b = self.backend
        with b.scope():
            qc, kc, vc = b.view(q), b.view(k), b.view(v)
            O = out if out is not None else b.empty(self.o_shape, q.dtype)
            lse = b.empty(self.lse_shape, "float32")
            Oc, lsec = b.view(O), b.view(lse)
            if self.decode:  # split as choose_num_splits says
                from .decode import decode_attention

                causal_br = "bottom_right" if self.causal else False  # the same mask: Nq == Nk
                O_d, lse_d = decode_attention(
                    qc, kc, vc, causal=causal_br, scale=self.scale, return_lse=True
                )
                Oc[...], lsec[...] = O_d, lse_d
            elif self.G != 1:
                from ._launch import launch_grouped

                launch_grouped(
                    self.ver, qc, kc, vc, Oc, lsec, G=self.G, causal=self.causal, scale=self.scale
                )
            else:
                from ._launch import launch

                launch(self.ver, qc, kc, vc, Oc, lsec, causal=self.causal, scale=self.scale)
        return O, lse
