"""The launch of a decode call: checked CuPy inputs in, the split (and combine) kernels run.

``flashref.gpu.decode`` checks the arguments and makes the plan (``decode_plan``); this module
runs it with as little host work per call as it can: each input passed as it is when it is
already C-contiguous and aligned, the kernels' scalar arguments made once per value, the
compiled kernels kept per (d, row tiles, dtype, version, device), and the partials of a
split call in ``flashref.gpu.decode.workspace``'s buffer (``O`` and ``lse`` are new arrays:
the caller keeps them).
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from .. import _host
from .checks import check_page_size
from .versions import SM90A_VERSIONS, VERSIONS
from .versions import TILE_KEYS as BC
from .workspace import partials, views


def launch(
    cp,
    q,
    K,
    V,
    bt,
    lengths,
    *,
    Hkv,
    page_size,
    max_pages,
    causal,
    scale,
    plan,
    O=None,
    lse=None,
    fresh=False,
):
    """Run the kernels on checked CuPy inputs; returns ``O (B, Hq, Nq, d)``, ``lse (B, Hq, Nq)``
    (written into ``O`` and ``lse`` where given: C-contiguous arrays of those shapes).

    ``fresh``: the partials and counters are new arrays of this call (from the current
    allocator: torch's, for a torch call, so that a captured graph owns its own) instead of
    the buffers kept per stream.

    ``K``, ``V``: the pool ``(num_pages, Hkv, page_size, d)`` (a contiguous cache is B pages
    of ``Nk`` slots); ``bt`` int32 ``(B, max_pages)`` or None; ``lengths`` int32 ``(B,)`` or
    None (every sequence has ``page_size`` keys). Every output element is written. The
    partials of ``S > 1`` splits live in ``flashref.gpu.decode.workspace``'s buffer.
    """
    from .._launch import as_kernel_input

    B, Hq, Nq, d = q.shape
    if bt is not None:  # a contiguous cache's tile may run past Nk: those keys are past L
        check_page_size(page_size, K.shape[0] * Hkv * page_size, plan.version, "K")
    q = as_kernel_input(q, q.shape)  # as they are when already contiguous and aligned
    K, V = as_kernel_input(K, K.shape), as_kernel_input(V, V.shape)
    if scale < 0:  # the kernel takes the row max of raw scores: flip q's sign instead
        q = (q.view(cp.uint16) ^ np.uint16(0x8000)).view(q.dtype)
        scale = -scale
    O = cp.empty((B, Hq, Nq, d), dtype=q.dtype) if O is None else O
    lse = cp.empty((B, Hq, Nq), dtype=cp.float32) if lse is None else lse
    if B == 0:
        return O, lse
    S, rows = plan.num_splits, B * Hq * Nq
    split_fn, combine_fn = _functions(cp, d, plan.row_tiles, q.dtype, plan.smem_bytes, plan.version)
    consts = _scalars(Hq, Hkv, Nq, page_size, max_pages, float(scale), bool(causal))
    null = np.uintp(0)
    bt_arg, len_arg = null if bt is None else bt, null if lengths is None else lengths
    maps = ()  # the TMA versions' split kernels (5 to 7) take K and V's maps last
    if plan.version in SM90A_VERSIONS:  # K and V as (rows, d), boxes of BC rows
        from .._launch import tensor_map_of

        maps = (tensor_map_of(K.reshape(-1, d), BC), tensor_map_of(V.reshape(-1, d), BC))
    with _partials(cp, rows, S, d, O, lse, fresh) as (O_part, lse_part):
        args = (q, K, V, bt_arg, len_arg, O, lse, O_part, lse_part, *consts)
        if combine_fn is None:  # versions 4, 5: the last split block of each row block merges
            from .counters import counting

            n = B * plan.grid[1]  # one counter per (b, blockIdx.y)
            fresh_zeros = contextlib.nullcontext(cp.zeros(n, dtype=cp.uint32)) if fresh else None
            with fresh_zeros or counting(cp, n) as counters:
                split_fn(
                    plan.grid, (plan.threads,), (*args, counters, *maps), shared_mem=plan.smem_bytes
                )
            return O, lse
        split_fn(plan.grid, (plan.threads,), (*args, *maps), shared_mem=plan.smem_bytes)
        if S > 1:
            combine_fn(((rows + 3) // 4,), (128,), (O_part, lse_part, O, lse, *_ints(rows, S)))
    return O, lse


class DirectDecode:
    """A decode call signature ready to launch with the arrays' addresses (``__call__``):
    the compiled kernels, grid, scalar arguments and shapes made once, so that a call checks
    that its arrays are contiguous and aligned, allocates ``O``, ``lse`` (and the partials of
    ``S > 1`` splits) from the backend ``b`` (``flashref.gpu._host``: torch's graph-aware
    allocator, or CuPy's pool) and launches on the backend's stream.

    ``keep_lse=False`` (the caller returns only ``O``): a call returns ``(O, None)``, its lse
    written after the partials in their one allocation (with ``S > 1``), one allocation less.

    ``usable`` is False where the general ``launch`` must run every call: a negative scale
    (q's sign is flipped first), versions 4 and 5 (their arrival counters), tables not int32.
    """

    def __init__(
        self,
        cp,
        b,
        q,
        K,
        bt,
        lengths,
        *,
        Hkv,
        page_size,
        max_pages,
        causal,
        scale,
        plan,
        keep_lse=True,
    ):
        tables = tuple(x for x in (bt, lengths) if x is not None)
        self.usable = (
            scale > 0
            and VERSIONS[plan.version].combine_kernel is not None
            and all(str(x.dtype).removeprefix("torch.") == "int32" for x in tables)
        )
        if not self.usable:
            return
        B, Hq, Nq, d = q.shape
        if bt is not None:
            check_page_size(page_size, K.shape[0] * Hkv * page_size, plan.version, "K")
        self.cp, self.b, self.plan, self.d = cp, b, plan, d
        self.dtype = str(q.dtype).removeprefix("torch.")
        self.q_dtype = q.dtype
        self.o_shape, self.lse_shape = (B, Hq, Nq, d), (B, Hq, Nq)
        self.S, self.rows = plan.num_splits, B * Hq * Nq
        self.fns = _functions(cp, d, plan.row_tiles, self.dtype, plan.smem_bytes, plan.version)
        self.consts = _scalars(Hq, Hkv, Nq, page_size, max_pages, float(scale), bool(causal))
        self.combine_grid = ((self.rows + 3) // 4, 1, 1)
        self.grid, self.block = plan.grid, (plan.threads, 1, 1)
        self.launchers = None  # (split, combine) _driver.Launcher, made at the first call
        self.combine_ints = _ints(self.rows, self.S)
        self.ws_shape = (self.rows * self.S * (d + 1),)
        self.keep_lse = keep_lse  # False: lse goes in the partials' allocation (S > 1)
        self.ws_bytes = self.ws_shape[0] * 4
        self.ws_lse_shape = (self.ws_shape[0] + self.rows,)
        self.lse_offset = self.rows * self.S * d * 4  # bytes: workspace.views' layout
        self.tma = plan.version in SM90A_VERSIONS
        if self.tma:
            from .._launch import tensor_map_ptr

            self.map_of = tensor_map_ptr  # the cached TMA descriptors (bytes)
        self.kv_rows = K.shape[0] * K.shape[1] * K.shape[2]
        self.device = b.device if b.device is not None else cp.cuda.runtime.getDevice()
        self.empty = B == 0

    def __call__(self, q, K, V, bt, lengths):
        """``(O, lse)`` (``lse`` None unless kept), or None where an array must be copied first
        (the general route)."""
        b = self.b
        contiguous = b.contiguous
        if not (contiguous(q) and contiguous(K) and contiguous(V)):
            return None
        if (bt is not None and not contiguous(bt)) or (
            lengths is not None and not contiguous(lengths)
        ):
            return None
        qp, kp, vp = b.ptr(q), b.ptr(K), b.ptr(V)
        if (qp | kp | vp) & 15:
            return None
        O = b.empty(self.o_shape, self.q_dtype)
        if self.keep_lse or self.S == 1 or self.empty:
            lse = b.empty(self.lse_shape, "float32")
            ws = b.empty(self.ws_shape, "float32") if self.S > 1 and not self.empty else None
            Lp = b.ptr(lse)
        else:  # lse is not returned: it lives after the partials, in their allocation
            lse = None
            ws = b.empty(self.ws_lse_shape, "float32")
            Lp = b.ptr(ws) + self.ws_bytes
        if self.empty:
            return O, lse
        Op = b.ptr(O)
        if self.S > 1:
            Opart = b.ptr(ws)
            Lpart = Opart + self.lse_offset
        else:
            Opart, Lpart = Op, Lp
        bt_p = 0 if bt is None else b.ptr(bt)  # a null pointer: a contiguous cache
        len_p = 0 if lengths is None else b.ptr(lengths)  # null: every length is page_size
        self.launch(qp, kp, vp, bt_p, len_p, Op, Lp, Opart, Lpart, b.stream_ptr())
        return O, lse

    def launch(self, qp, kp, vp, bt_p, len_p, Op, Lp, Opart, Lpart, stream) -> None:
        """The kernels on the arrays at these addresses (checked by the caller), on the stream
        of handle ``stream``: ``Opart``, ``Lpart`` the partials of ``S > 1`` splits (with
        ``S == 1``, ``Op`` and ``Lp`` themselves). What ``flashref.gpu.decode.plan`` replays."""
        split_fn, combine_fn = self.fns
        maps = ()
        if self.tma:  # K and V as (rows, d), boxes of BC rows
            map_of, n, d, dt, dev = self.map_of, self.kv_rows, self.d, self.dtype, self.device
            maps = (map_of(kp, n, d, dt, BC, dev), map_of(vp, n, d, dt, BC, dev))
        split_args = (qp, kp, vp, bt_p, len_p, Op, Lp, Opart, Lpart, *self.consts, *maps)
        combine_args = (Opart, Lpart, Op, Lp, *self.combine_ints)
        with _host.device_scope(self.cp, self.device):  # the kernels are this device's
            if self.launchers is None:
                self.launchers = (
                    _host.launcher(split_fn, split_args),
                    _host.launcher(combine_fn, combine_args),
                )
            split, combine = self.launchers
            split(self.grid, self.block, self.plan.smem_bytes, stream, split_args)
            if self.S > 1:
                combine(self.combine_grid, (128, 1, 1), 0, stream, combine_args)


@contextlib.contextmanager
def _partials(cp, rows: int, S: int, d: int, O, lse, fresh: bool = False):
    """``(O_part, lse_part)``: the workspace's views for ``S > 1`` (new arrays if ``fresh``),
    else ``O`` and ``lse`` themselves (one split writes its result directly)."""
    if S == 1:
        yield O, lse
        return

    if fresh:
        yield views(cp.empty(rows * S * (d + 1), dtype=cp.float32), rows, S, d)
        return

    with partials(cp, rows, S, d) as parts:
        yield parts


@functools.lru_cache(maxsize=256, typed=True)
def _scalars(Hq, Hkv, Nq, page_size, max_pages, scale: float, causal: bool) -> tuple:
    """The split kernel's scalar arguments, made once per value (NumPy scalars cost host time)."""
    return (
        np.int32(Hq),
        np.int32(Hkv),
        np.int32(Nq),
        np.int32(page_size),
        np.int32(max_pages),
        np.float32(scale),
        np.int32(causal),
    )


@functools.lru_cache(maxsize=256)
def _ints(*values: int) -> tuple:
    return tuple(np.int32(x) for x in values)


_cache: dict = {}


def _functions(cp, d: int, tiles: int, dtype, smem: int, version: int):
    """The compiled (split, combine) kernels; ``dtype`` a NumPy dtype (or its name)."""
    dtype = str(dtype)  # a NumPy dtype and its name share one module
    key = (d, tiles, dtype, version, cp.cuda.runtime.getDevice())
    fns = _cache.get(key)
    if fns is None:
        from .._launch import NVRTC_OPTIONS
        from .versions import VERSIONS, defines, source

        split_name, combine_name = VERSIONS[version].split_kernel, VERSIONS[version].combine_kernel
        arch = ("-arch=sm_90a",) if version in SM90A_VERSIONS else ()
        opts = (*NVRTC_OPTIONS, *arch, *defines(d, tiles, str(dtype)))
        module = cp.RawModule(code=source(version), options=opts)
        split_fn = module.get_function(split_name)
        split_fn.max_dynamic_shared_size_bytes = smem
        combine_fn = module.get_function(combine_name) if combine_name else None
        fns = _cache[key] = (split_fn, combine_fn)
    return fns
