"""The general launch of a decode call: checked CuPy inputs in, the split (and combine)
kernels run; and the kernels, compiled.

``flashref.gpu.decode.api`` checks a call and plans it; a call whose arrays the kernels can
read as they are launches from its plan (``api.DirectDecode``), any other here, with CuPy
operations and as little host work as it can: each input passed as it is when it is already
C-contiguous and aligned, the kernels' scalar arguments made once per value, the compiled
kernels kept per (version, d, row tiles, dtype, device), and the partials of a split call in
``flashref.gpu.decode.buffers`` (``O`` and ``lse`` are new arrays: the caller keeps them).
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from .buffers import counting, partials, views
from .versions import SM90A_VERSIONS, VERSIONS
from .versions import TILE_KEYS as BC


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
    partials of ``S > 1`` splits live in ``flashref.gpu.decode.buffers``.
    """
    from .._launch import as_kernel_input

    B, Hq, Nq, d = q.shape
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
    split_fn, combine_fn = kernels(cp, d, plan.row_tiles, q.dtype, plan.smem_bytes, plan.version)
    consts = split_scalars(Hq, Hkv, Nq, page_size, max_pages, float(scale), bool(causal))
    null = np.uintp(0)
    bt_arg, len_arg = null if bt is None else bt, null if lengths is None else lengths
    maps = ()  # the TMA versions' split kernels (5 to 7) take K and V's maps last
    if plan.version in SM90A_VERSIONS:  # K and V as (rows, d), boxes of BC rows
        from .._launch import tensor_map_of

        maps = (tensor_map_of(K.reshape(-1, d), BC), tensor_map_of(V.reshape(-1, d), BC))
    with _partials(cp, rows, S, d, O, lse, fresh) as (O_part, lse_part):
        args = (q, K, V, bt_arg, len_arg, O, lse, O_part, lse_part, *consts)
        if combine_fn is None:  # versions 4, 5: the last split block of each row block merges
            n = B * plan.grid[1]  # one counter per (b, blockIdx.y)
            fresh_zeros = contextlib.nullcontext(cp.zeros(n, dtype=cp.uint32)) if fresh else None
            with fresh_zeros or counting(cp, n) as counters:
                split_fn(
                    plan.grid, (plan.threads,), (*args, counters, *maps), shared_mem=plan.smem_bytes
                )
            return O, lse
        split_fn(plan.grid, (plan.threads,), (*args, *maps), shared_mem=plan.smem_bytes)
        if S > 1:
            combine_fn(((rows + 3) // 4,), (128,), (O_part, lse_part, O, lse, *int32s(rows, S)))
    return O, lse


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
def split_scalars(Hq, Hkv, Nq, page_size, max_pages, scale: float, causal: bool) -> tuple:
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
def int32s(*values: int) -> tuple:
    return tuple(np.int32(x) for x in values)


def kernels(cp, d: int, tiles: int, dtype, smem: int, version: int):
    """The compiled (split, combine) kernels (combine None for versions 4, 5); ``dtype`` a
    NumPy dtype or its name (``_launch.compiled``'s cache)."""
    from .._launch import compiled
    from .versions import defines, source

    dtype, ver = str(dtype), VERSIONS[version]  # a NumPy dtype and its name share one build
    arch = ("-arch=sm_90a",) if version in SM90A_VERSIONS else ()
    return compiled(
        ("decode", version, d, tiles, dtype),
        lambda: source(version),
        (*arch, *defines(d, tiles, dtype)),
        (ver.split_kernel, ver.combine_kernel),
        {ver.split_kernel: smem},
    )
