"""The backward pass of attention on the GPU: dQ, dK, dV from the forward's O and lse.

The loop of ``flashref.tiled_attention_backward`` as CUDA kernels, in numbered versions
(``BWD_VERSIONS``; sources ``flashref/kernels/bwd*_*.cu``). One call runs three kernels:

    bwd_preprocess   D = rowsum(dO * O)                          (B*H, Nq) float32
    flash_bwdN       per key tile j: dK_j, dV_j; dQ_i shares      dQacc (B*H, Nq, d) float32
    bwd_dq_convert   dQ = scale * dQacc in q's dtype

or, for versions with ``deterministic_dq`` (a separate pass instead of atomics), the main
kernel writes only dK, dV and ``flash_bwdN_dq`` computes dQ per query tile, written once.

Conventions and argument checks are those of the forward ``flash_attention`` and of the CPU
``naive_attention_backward`` (the same messages): ``o`` and ``do`` shaped like q, ``lse``
``(..., Nq)`` float32 as ``flash_attention(..., return_lse=True)`` returns it (natural log,
scale included), top-left causal, any Nq and Nk.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import _host
from ._runtime import check_capability, check_inputs, device_cc, dtype_name, require_gpu
from .backward_versions import (
    BWD_VERSIONS,
    CONVERT_THREADS,
    PRE_THREADS,
    BwdVersion,
    default_bwd_version,
    pre_post_source,
)

BWD_DTYPES = ("float16", "bfloat16")


def _check_array(x, name: str):
    if not (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "ndim")):
        raise TypeError(
            f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}"
        )


def check_backward_inputs(q, k, v, o, lse, do, causal, scale, version):
    """Every check that needs no GPU, in the CPU backward's order and words.

    Returns ``(dtype, d, scale, BwdVersion, G)``, ``G = Hq // Hkv`` the group size.
    """
    for name, x in (("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("do", do)):
        _check_array(x, name)
    # the NumPy shape rules and messages
    dtype, d, scale, G = check_inputs(q, k, v, causal, scale, False, "flash_attention_backward")
    o_shape = tuple(q.shape[:-1]) + tuple(v.shape[-1:])
    for name, arr in (("o", o), ("do", do)):
        if tuple(arr.shape) != o_shape:
            raise ValueError(
                f"{name} has shape {tuple(arr.shape)}; expected {o_shape} (..., Nq, dv) "
                f"for q {tuple(q.shape)} and v {tuple(v.shape)}"
            )
    if tuple(lse.shape) != tuple(q.shape[:-1]):
        raise ValueError(
            f"lse has shape {tuple(lse.shape)}; expected {tuple(q.shape[:-1])} (..., Nq) "
            f"for q {tuple(q.shape)}"
        )
    for name, x in (("o", o), ("do", do)):
        if dtype_name(x) != dtype:
            raise TypeError(f"{name} has dtype {dtype_name(x)}; expected q's dtype, {dtype}")
    if dtype_name(lse) != "float32":
        raise TypeError(
            f"lse has dtype {dtype_name(lse)}; expected float32, as flash_attention(..., "
            "return_lse=True) returns it"
        )
    if dtype not in BWD_DTYPES:
        raise TypeError(
            f"q has dtype {dtype}; flash_attention_backward supports {', '.join(BWD_DTYPES)}"
        )
    return dtype, d, scale, resolve_bwd_version(version, dtype, d, bool(causal)), G


def resolve_bwd_version(version, dtype: str, d: int, causal: bool = False, cc=None) -> BwdVersion:
    """``version`` checked against the dtype and d, or for None the default of a GPU of
    compute capability ``cc`` (``default_bwd_version``; None: any GPU's table)."""
    if version is None:
        # an unsupported d has no entry: version 1's check below names the head dims
        ver = BWD_VERSIONS[default_bwd_version(dtype, d, causal, cc) or 1]
    elif isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise TypeError(f"version must be an int or None, got {type(version).__name__}")
    elif version not in BWD_VERSIONS:
        raise ValueError(f"version must be one of {sorted(BWD_VERSIONS)} or None, got {version}")
    else:
        ver = BWD_VERSIONS[int(version)]
    if dtype not in ver.dtypes:
        raise TypeError(
            f"backward version {ver.number} takes {' or '.join(ver.dtypes)}, q is {dtype}"
        )
    if d not in ver.head_dims:
        dims = ", ".join(map(str, ver.head_dims))
        raise ValueError(
            f"q has head dim d={d}; backward version {ver.number} supports d in {dims}"
        )
    return ver


def get_functions(ver: BwdVersion, d: int, dtype: str):
    """(preprocess, main, last) compiled for head dim ``d`` and ``dtype`` on this device; the
    last kernel converts the atomics' float32 dQ, or is the version's own dQ pass."""
    from ._launch import compiled

    opts = tuple(ver.defines(d, dtype))
    pre, convert = compiled(
        ("backward pre/post", opts), pre_post_source, opts, ("bwd_preprocess", "bwd_dq_convert")
    )
    dq_kernel = ver.dq_kernel if ver.deterministic_dq else None
    smem = {ver.kernel: ver.smem_bytes(d)}
    if dq_kernel:
        smem[dq_kernel] = ver.dq_smem_bytes(d)
    main, dq = compiled(
        ("backward", ver.number, d, dtype),
        ver.source,
        (*opts, *ver.nvrtc_options()),
        (ver.kernel, dq_kernel),
        smem,
    )
    return pre, main, dq or convert


def _tma_maps(ver: BwdVersion, q3, k3, v3, do3, d: int) -> tuple:
    """(qmap, kmap, vmap, domap) over (B*H*N, d) views: Q and dO boxes of Br rows, K and V of
    Bc rows (64 columns each, 128-byte swizzle), in the order the kernel takes them."""
    from ._launch import tensor_map_of

    rows = {"q": ver.Br, "k": ver.Bc, "v": ver.Bc, "do": ver.Br}  # box rows of each map
    arrays = {"q": q3, "k": k3, "v": v3, "do": do3}
    return tuple(tensor_map_of(arrays[n].reshape(-1, d), rows[n]) for n in rows)


def launch_backward(ver, q, k, v, o, lse, do, dq, dk, dv, *, causal: bool, scale: float):
    """Run backward version ``ver`` on checked CuPy inputs, writing every element of
    ``dq (..., Nq, d)``, ``dk`` and ``dv (..., Nk, d)`` (C-contiguous, the inputs' dtype)."""
    import cupy as cp

    from ._launch import MAX_GRID_Y, as_kernel_input

    *lead, Nq, d = q.shape
    Nk = k.shape[-2]
    BH = math.prod(lead)
    if BH == 0:
        return
    if Nq == 0 or Nk == 0:  # no query, or no key to attend to: nothing flows back
        for x in (dq, dk, dv):
            x.fill(0)
        return
    q3, o3, do3 = (as_kernel_input(x, (BH, Nq, d)) for x in (q, o, do))  # (B*H, Nq, d)
    k3, v3 = (as_kernel_input(x, (BH, Nk, d)) for x in (k, v))  # (B*H, Nk, d)
    lse2 = as_kernel_input(lse, (BH, Nq))  # (B*H, Nq)
    Dvec = cp.empty((BH, Nq), dtype=cp.float32)  # (B*H, Nq)
    dq3, dk3, dv3 = dq.reshape(BH, Nq, d), dk.reshape(BH, Nk, d), dv.reshape(BH, Nk, d)  # views
    dQacc = None if ver.deterministic_dq else cp.zeros((BH, Nq, d), dtype=cp.float32)  # atomics
    pre, main, last = get_functions(ver, d, str(q.dtype))
    rows = PRE_THREADS // (d // 8)
    Tr, Tc = (Nq + ver.Br - 1) // ver.Br, (Nk + ver.Bc - 1) // ver.Bc
    ints = (np.int32(Nq), np.int32(Nk), np.float32(scale), np.int32(causal))
    for b0 in range(0, BH, MAX_GRID_Y):
        b = slice(b0, min(BH, b0 + MAX_GRID_Y))
        nb = b.stop - b.start
        pre(((Nq + rows - 1) // rows, nb), (PRE_THREADS,), (o3[b], do3[b], Dvec[b], np.int32(Nq)))
        common = (q3[b], k3[b], v3[b], do3[b], lse2[b], Dvec[b])
        if ver.deterministic_dq:  # dK, dV; then dQ per query tile, written once
            main(
                (Tc, nb),
                (ver.threads,),
                (*common, dk3[b], dv3[b], *ints),
                shared_mem=ver.smem_bytes(d),
            )
            last(
                (Tr, nb), (ver.threads,), (*common, dq3[b], *ints), shared_mem=ver.dq_smem_bytes(d)
            )
        else:  # dK, dV, and dQ / scale added into dQacc
            maps = _tma_maps(ver, q3[b], k3[b], v3[b], do3[b], d) if ver.tma else ()
            if ver.dq_tensor_map:  # dQacc's map over this chunk of heads
                from ._launch import dq_tensor_map
                from .tma import MAP_DTYPE

                m = dq_tensor_map(dQacc[b].data.ptr, nb, Nq, d, cp.cuda.runtime.getDevice())
                maps += (np.frombuffer(m, dtype=MAP_DTYPE)[0],)
            main(
                (Tc, nb),
                (ver.threads,),
                (*common, dQacc[b], dk3[b], dv3[b], *ints, *maps),
                shared_mem=ver.smem_bytes(d),
            )
    if dQacc is not None:  # dQ = scale * dQacc in q's dtype
        pairs = BH * Nq * d // 2
        blocks = min((pairs + CONVERT_THREADS - 1) // CONVERT_THREADS, 8192)
        last((blocks,), (CONVERT_THREADS,), (dQacc, dq, np.int64(pairs), np.float32(scale)))


def launch_backward_grouped(ver, q, k, v, o, lse, do, dq, dk, dv, *, G, causal, scale) -> None:
    """Grouped K/V heads: ``q (..., Hkv * G, Nq, d)``, ``k``, ``v (..., Hkv, Nk, d)``.

    As the grouped forward (``_launch.launch_grouped``): the query heads with ``h % G = g``
    are shaped like k and v, so version ``ver`` runs once per ``g`` on the unchanged K/V. A
    shared K/V head's dK and dV are the sums of its ``G`` query heads' contributions: each
    launch writes its share in q's dtype, and the shares are added in float32 and rounded
    once (the rounding a naive backward on K/V repeated to q's heads, then summed, has too).
    """
    import cupy as cp

    *lead, Hq, Nq, d = q.shape
    Hkv = Hq // G

    qv, ov, dov, dqv = (x.reshape(*lead, Hkv, G, Nq, d) for x in (q, o, do, dq))  # views
    lsev = lse.reshape(*lead, Hkv, G, Nq)
    dq_g = cp.empty((*lead, Hkv, Nq, d), dtype=dq.dtype)  # one group member's heads
    dk_g, dv_g = cp.empty(k.shape, dtype=dk.dtype), cp.empty(v.shape, dtype=dv.dtype)
    dk_sum, dv_sum = cp.zeros(k.shape, cp.float32), cp.zeros(v.shape, cp.float32)
    for g in range(G):
        member = (qv[..., g, :, :], k, v, ov[..., g, :, :], lsev[..., g, :], dov[..., g, :, :])
        launch_backward(ver, *member, dq_g, dk_g, dv_g, causal=causal, scale=scale)
        dqv[..., g, :, :] = dq_g
        dk_sum += dk_g.astype(cp.float32)
        dv_sum += dv_g.astype(cp.float32)
    dk[...] = dk_sum.astype(dk.dtype)
    dv[...] = dv_sum.astype(dv.dtype)


def flash_attention_backward(q, k, v, o, lse, do, *, causal=False, scale=None, version=None):
    """Gradients ``(dq, dk, dv)`` of attention on the GPU, FlashAttention-2's backward.

    Args:
        q: (..., Nq, d); k, v: (..., Nk, d); CuPy arrays or torch CUDA tensors (read in place;
            a torch call runs on torch's current stream and allocates from torch's allocator,
            a CuPy call on CuPy's), float16 or bfloat16, d = 64 or 128. Grouped K/V heads
            (q (..., Hq, Nq, d), k, v (..., Hkv, Nk, d)) as in the forward: dk, dv sum over
            each group's query heads.
        o: (..., Nq, d), the forward's output, q's dtype; do: (..., Nq, d), dLoss/dO.
        lse: (..., Nq) float32, the forward's ``lse`` (``flash_attention(..., return_lse=True)``).
        causal, scale: as in the forward call that made ``o`` and ``lse`` (``causal`` as
            ``flash_attention`` takes it: top-left, ``"bottom_right"`` where ``Nq == Nk``).
        version: a key of ``BWD_VERSIONS``, or None for the default.

    Returns ``(dq, dk, dv)`` in q's dtype and kind (CuPy in, CuPy out; torch in, torch out).
    dK and dV are the same bits on every call; dQ too with version 2, while version 1 sums it
    with float32 atomics, so it can differ by the rounding of that sum's order
    (``BwdVersion.deterministic_dq``).
    """
    arrays = (q, k, v, o, lse, do)
    return backward_plan(arrays, causal, scale, version).run(arrays)


def backward_plan(arrays, causal=False, scale=None, version=None) -> _BwdPlan:
    """The checked plan of the call signature of ``arrays`` ``(q, k, v, o, lse, do)`` and the
    options (``_host.signature``): made (every check) once, then looked up. The torch
    adapter asks for it in the forward (``do`` is shaped like ``o``), so that its backward,
    which runs on the autograd engine's thread, only launches."""
    key = _host.signature(arrays, (causal, scale, version))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS.put(key, _BwdPlan(arrays, causal, scale, version))
    return plan


_NAMES = ("q", "k", "v", "o", "lse", "do")
_ALIGN = (16, 16, 16, 16, 4, 16)  # the kernels' 16-byte loads; lse is read as floats
_PLANS = _host.Kept()  # call signature -> _BwdPlan


class _BwdPlan(_host.Plan):
    """One checked call signature: the version, the compiled kernels, their grids and scalar
    arguments, so that a call reads six addresses, allocates and launches."""

    def __init__(self, arrays, causal, scale, version):
        q, k = arrays[0], arrays[1]
        dtype, d, scale, ver, G = check_backward_inputs(*arrays, causal, scale, version)
        causal = bool(causal)
        cp = require_gpu()
        super().__init__(cp, _host.backend_of(cp, tuple(zip(_NAMES, arrays, strict=True))))
        b = self.backend
        with b.scope():
            if version is None:  # this GPU's default (BWD_HOPPER_PREFERENCE on 9.0)
                ver = resolve_bwd_version(None, dtype, d, causal, device_cc(cp))
            check_capability(cp, ver)
        self.ver, self.dtype, self.d, self.scale, self.causal, self.G = (
            ver,
            dtype,
            d,
            scale,
            causal,
            G,
        )
        self.q_shape, self.k_shape = tuple(q.shape), tuple(k.shape)
        *lead, Nq, _ = q.shape
        Nk = k.shape[-2]
        BH = math.prod(lead)
        from ._launch import MAX_GRID_Y

        self.direct = G == 1 and Nq > 0 and Nk > 0 and 0 < BH <= MAX_GRID_Y
        if not self.direct:
            return
        with self.on_device():
            self.fns = get_functions(ver, d, dtype)
        rows = PRE_THREADS // (d // 8)
        Tr, Tc = (Nq + ver.Br - 1) // ver.Br, (Nk + ver.Bc - 1) // ver.Bc
        self.pre_grid = ((Nq + rows - 1) // rows, BH, 1)
        self.block = (ver.threads, 1, 1)
        self.ints = (np.int32(Nq), np.int32(Nk), np.float32(scale), np.int32(causal))
        self.Nq_arg = np.int32(Nq)
        self.main_grid, self.last_grid = (Tc, BH, 1), (Tr, BH, 1)
        self.BH, self.Nq, self.Nk = BH, Nq, Nk
        # one scratch allocation: D (B*H, Nq) float32, then (atomic versions) dQacc
        # (B*H, Nq, d) float32 at the next 256-byte boundary
        self.dqacc_offset = -(-BH * Nq * 4 // 256) * 256
        self.dqacc_bytes = 0 if ver.deterministic_dq else BH * Nq * d * 4
        self.scratch_floats = (self.dqacc_offset + self.dqacc_bytes) // 4
        self.smem = ver.smem_bytes(d)
        if ver.deterministic_dq:
            self.last_launch = (self.last_grid, self.block, ver.dq_smem_bytes(d))
        else:
            pairs = BH * Nq * d // 2
            blocks = min((pairs + CONVERT_THREADS - 1) // CONVERT_THREADS, 8192)
            self.last_launch = ((blocks, 1, 1), (CONVERT_THREADS, 1, 1), 0)
            self.convert_args = (np.int64(pairs), np.float32(scale))
        if ver.tma:
            from ._launch import dq_tensor_map, tensor_map_ptr

            self.map_of = tensor_map_ptr  # the cached TMA descriptors (bytes)
            self.dq_map_of = dq_tensor_map
            self.map_rows = ((BH * Nq, ver.Br), (BH * Nk, ver.Bc))  # q and do, k and v

    def run(self, arrays):
        ptrs = self.addresses(arrays, _ALIGN) if self.direct else None
        return self._general(arrays) if ptrs is None else self._direct(arrays, ptrs)

    def _direct(self, arrays, ptrs):
        b, ver, cp = self.backend, self.ver, self.cp
        dtype = arrays[0].dtype
        dq, dk, dv = (
            b.empty(self.q_shape, dtype),
            b.empty(self.k_shape, dtype),
            b.empty(self.k_shape, dtype),
        )
        scratch = b.empty((self.scratch_floats,), "float32")  # D (B*H, Nq), then dQacc
        qp, kp, vp, op, lp, dop = ptrs
        Dp = b.ptr(scratch)
        stream = b.stream_ptr()
        pre_args = (op, dop, Dp, self.Nq_arg)
        common = (qp, kp, vp, dop, lp, Dp)
        if ver.deterministic_dq:  # dK, dV; then dQ per query tile, written once
            main_args = (*common, b.ptr(dk), b.ptr(dv), *self.ints)
            last_args = (*common, b.ptr(dq), *self.ints)
        else:  # dK, dV, and dQ / scale added into dQacc; then dQ = scale * dQacc
            ap = Dp + self.dqacc_offset
            maps = ()
            if ver.tma:
                map_of, d, dt, dev = self.map_of, self.d, self.dtype, self.device
                (rq, bq), (rk, bk) = self.map_rows
                maps = (
                    map_of(qp, rq, d, dt, bq, dev),
                    map_of(kp, rk, d, dt, bk, dev),
                    map_of(vp, rk, d, dt, bk, dev),
                    map_of(dop, rq, d, dt, bq, dev),
                )
                if ver.dq_tensor_map:
                    maps += (self.dq_map_of(ap, self.BH, self.Nq, d, dev),)
            main_args = (*common, ap, b.ptr(dk), b.ptr(dv), *self.ints, *maps)
            last_args = (ap, b.ptr(dq), *self.convert_args)
        pre, main, last = self.fns
        with self.on_device():
            self.launch(pre, self.pre_grid, (PRE_THREADS, 1, 1), 0, stream, pre_args)
            if not ver.deterministic_dq:
                _host.memset_zero(cp, ap, self.dqacc_bytes, stream)
            self.launch(main, self.main_grid, self.block, self.smem, stream, main_args)
            self.launch(last, *self.last_launch, stream, last_args)
        return dq, dk, dv

    def _general(self, arrays):
        """Grouped heads, empty shapes, inputs to copy first: CuPy operations inside the
        backend's scope (torch's stream and allocator for torch tensors)."""
        b, q = self.backend, arrays[0]
        with b.scope():
            q_, k_, v_, o_, lse_, do_ = (b.view(x) for x in arrays)
            grads = (
                b.empty(self.q_shape, q.dtype),
                b.empty(self.k_shape, q.dtype),
                b.empty(self.k_shape, q.dtype),
            )
            dq, dk, dv = (b.view(x) for x in grads)
            kw = {"causal": self.causal, "scale": self.scale}
            if self.G == 1:
                launch_backward(self.ver, q_, k_, v_, o_, lse_, do_, dq, dk, dv, **kw)
            else:
                launch_backward_grouped(
                    self.ver, q_, k_, v_, o_, lse_, do_, dq, dk, dv, G=self.G, **kw
                )
        return grads
