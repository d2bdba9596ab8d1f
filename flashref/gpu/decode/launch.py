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

from .checks import SM90A_VERSIONS, check_page_size
from .checks import TILE_KEYS as BC


def launch(cp, q, K, V, bt, lengths, *, Hkv, page_size, max_pages, causal, scale, plan):
    """Run the kernels on checked CuPy inputs; returns ``O (B, Hq, Nq, d)``, ``lse (B, Hq, Nq)``.

    ``K``, ``V``: the pool ``(num_pages, Hkv, page_size, d)`` (a contiguous cache is B pages
    of ``Nk`` slots); ``bt`` int32 ``(B, max_pages)`` or None; ``lengths`` int32 ``(B,)`` or
    None (every sequence has ``page_size`` keys). Every output element is written. The
    partials of ``S > 1`` splits live in ``flashref.gpu.decode.workspace``'s buffer.
    """
    from .._launch import _as_kernel_input

    B, Hq, Nq, d = q.shape
    if bt is not None:  # a contiguous cache's tile may run past Nk: those keys are past L
        check_page_size(page_size, K.shape[0] * Hkv * page_size, plan.version, "K")
    q = _as_kernel_input(q, q.shape)  # as they are when already contiguous and aligned
    K, V = _as_kernel_input(K, K.shape), _as_kernel_input(V, V.shape)
    if scale < 0:  # the kernel takes the row max of raw scores: flip q's sign instead
        q = (q.view(cp.uint16) ^ np.uint16(0x8000)).view(q.dtype)
        scale = -scale
    O = cp.empty((B, Hq, Nq, d), dtype=q.dtype)
    lse = cp.empty((B, Hq, Nq), dtype=cp.float32)
    if B == 0:
        return O, lse
    S, rows = plan.num_splits, B * Hq * Nq
    split_fn, combine_fn = _functions(cp, d, plan.row_tiles, q.dtype, plan.smem_bytes,
                                      plan.version)  # fmt: skip
    consts = _scalars(Hq, Hkv, Nq, page_size, max_pages, float(scale), bool(causal))
    null = np.uintp(0)
    bt_arg, len_arg = null if bt is None else bt, null if lengths is None else lengths
    maps = ()  # the TMA versions' split kernels (5 to 7) take K and V's maps last
    if plan.version in SM90A_VERSIONS:  # K and V as (rows, d), boxes of BC rows
        from .._launch import tensor_map_of

        maps = (tensor_map_of(K.reshape(-1, d), BC), tensor_map_of(V.reshape(-1, d), BC))
    with _partials(cp, rows, S, d, O, lse) as (O_part, lse_part):
        args = (q, K, V, bt_arg, len_arg, O, lse, O_part, lse_part, *consts)
        if combine_fn is None:  # versions 4, 5: the last split block of each row block merges
            from .counters import counting

            with counting(cp, B * plan.grid[1]) as counters:  # one per (b, blockIdx.y)
                split_fn(plan.grid, (plan.threads,), (*args, counters, *maps),
                         shared_mem=plan.smem_bytes)  # fmt: skip
            return O, lse
        split_fn(plan.grid, (plan.threads,), (*args, *maps), shared_mem=plan.smem_bytes)
        if S > 1:
            combine_fn(((rows + 3) // 4,), (128,), (O_part, lse_part, O, lse, *_ints(rows, S)))
    return O, lse


@contextlib.contextmanager
def _partials(cp, rows: int, S: int, d: int, O, lse):
    """``(O_part, lse_part)``: the workspace's views for ``S > 1``, else ``O`` and ``lse``
    themselves (one split writes its result directly)."""
    if S == 1:
        yield O, lse
        return
    from .workspace import partials

    with partials(cp, rows, S, d) as views:
        yield views


@functools.lru_cache(maxsize=256, typed=True)
def _scalars(Hq, Hkv, Nq, page_size, max_pages, scale: float, causal: bool) -> tuple:
    """The split kernel's scalar arguments, made once per value (NumPy scalars cost host time)."""
    return (np.int32(Hq), np.int32(Hkv), np.int32(Nq), np.int32(page_size), np.int32(max_pages),
            np.float32(scale), np.int32(causal))  # fmt: skip


@functools.lru_cache(maxsize=256)
def _ints(*values: int) -> tuple:
    return tuple(np.int32(x) for x in values)


_cache: dict = {}


def _functions(cp, d: int, tiles: int, dtype, smem: int, version: int):
    """The compiled (split, combine) kernels; ``dtype`` a NumPy dtype (or its name)."""
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
