"""Compiling the .cu files with NVRTC (through CuPy) and launching them.

Imported only after ``flashref.gpu`` has checked that CuPy and a GPU are there.
Each (version, head dim, dtype, device) is compiled once per process, with
``-DHEAD_DIM=d`` so that every loop over d has a compile-time trip count (and
``-DFLASHREF_BF16`` for bfloat16); CuPy also keeps the resulting cubin in its
on-disk cache (``~/.cupy/kernel_cache``, or ``$CUPY_CACHE_DIR`` if it is set
before CuPy is imported), so a later process skips NVRTC but still loads the module.
"""

from __future__ import annotations

import math
import os

import cupy as cp
import numpy as np

from ._host import Kept
from .forward_versions import max_persistent_blocks
from .tma import MAP_DTYPE, tensor_map, tensor_map_at

# CuPy adds -arch=sm_XY for the current device. FLASHREF_NVRTC_FLAGS adds more, for example
# -lineinfo, which lets Nsight Compute's source view map SASS back to .cu lines.
NVRTC_OPTIONS = ("--std=c++17", *os.environ.get("FLASHREF_NVRTC_FLAGS", "").split())
MAX_GRID_Y = 65535  # blockIdx.y runs over batch*heads
DEFAULT_SMEM = 48 * 1024  # more than this needs an explicit opt-in per kernel


# A persistent version's grid is min(work tiles, SMs); a smaller cap here makes each block walk
# many work tiles even at small shapes (the GPU tests set it, the sanitizer runs through the
# environment variable; None: the SM count alone).
MAX_PERSISTENT_BLOCKS = max_persistent_blocks(os.environ.get("FLASHREF_MAX_PERSISTENT_BLOCKS"))

_device_facts: dict[int, tuple[tuple[int, int], str, int]] = {}


def device_facts() -> tuple[tuple[int, int], str, int]:
    """The current device's (compute capability, name, SM count), asked once per device: the
    driver's property queries cost more than a short kernel's launch."""
    dev = cp.cuda.Device()
    if dev.id not in _device_facts:
        cc = divmod(int(dev.compute_capability), 10)
        name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
        sms = int(dev.attributes["MultiProcessorCount"])
        _device_facts[dev.id] = ((int(cc[0]), int(cc[1])), name, sms)
    return _device_facts[dev.id]


def sm_count() -> int:
    """The current device's number of SMs (asked once per device)."""
    return device_facts()[2]


_COMPILED: dict[tuple, tuple] = {}  # (what, device) -> kernels: every family's, one cache


def compiled(what: tuple, source, options, kernels, smem=None) -> tuple:
    """The kernels named ``kernels`` (None gives None) of the module NVRTC makes from
    ``source()`` with ``options`` on the current device, compiled once per process for
    ``(what, device)``: ``what`` names the build (family, version, head dim, dtype...) and
    must change where ``source`` or ``options`` do. ``smem`` maps a kernel's name to the
    dynamic shared memory it is opted in to (above ``DEFAULT_SMEM``). The one compile cache
    of the forward, backward, decode, paged-prefill and paged-cache kernels."""
    key = (what, cp.cuda.runtime.getDevice())
    fns = _COMPILED.get(key)
    if fns is None:
        module = cp.RawModule(code=source(), options=(*NVRTC_OPTIONS, *options))
        fns = tuple(None if name is None else module.get_function(name) for name in kernels)
        for name, fn in zip(kernels, fns, strict=True):
            if smem and smem.get(name, 0) > DEFAULT_SMEM:
                fn.max_dynamic_shared_size_bytes = smem[name]
        _COMPILED[key] = fns
    return fns


def get_function(ver, d: int, dtype=None):
    """The compiled kernel of version ``ver`` for head dim ``d`` and ``dtype`` on this device."""
    dtype = str(dtype or ver.dtype)  # a name or a NumPy dtype: the key holds its name
    options = (*ver.nvrtc_options(), *ver.defines(d, dtype))
    smem = {ver.kernel: ver.smem_bytes(d)}
    return compiled(("forward", ver.number, d, dtype), ver.source, options, (ver.kernel,), smem)[0]


_MAPS = Kept(64)  # tensor maps (a map holds only an address, a shape and a box)


def tensor_map_of(x2, box_rows: int):
    """The TMA descriptor of the 2-D CuPy array ``x2`` with a (box_rows, 64) box, as a CuPy
    launch takes it (``tma.MAP_DTYPE``).

    The descriptor depends only on the address, shape, dtype and box of a C-contiguous
    array (``tensor_map_ptr``, whose cache this reads); another layout is encoded as it is
    (``tma.tensor_map`` checks it), uncached.
    """
    if x2.flags.c_contiguous:
        m = tensor_map_ptr(
            x2.data.ptr, *x2.shape, str(x2.dtype), box_rows, cp.cuda.runtime.getDevice()
        )
        return np.frombuffer(m, dtype=MAP_DTYPE)[0]
    return tensor_map(x2, box_rows)


def tensor_map_ptr(ptr: int, rows: int, cols: int, dtype: str, box_rows: int, device: int):
    """The 128 bytes of the TMA descriptor of the C-contiguous (rows, cols) array at ``ptr``
    on ``device`` with a (box_rows, 64) box, cached: it depends only on those (a cached one is
    exactly what a new encoding would make). No array object is needed: a torch tensor's
    address will do. What a ``_driver.Launcher`` passes for a ``"m"`` argument."""
    key = (ptr, rows, cols, dtype, box_rows, device)
    m = _MAPS.get(key)
    if m is None:
        m = _MAPS.put(key, tensor_map_at(ptr, rows, cols, dtype, box_rows))
    return m


def dq_tensor_map(ptr: int, heads: int, rows: int, cols: int, device: int) -> bytes:
    """The 128 bytes of the TMA descriptor a backward version with ``dq_tensor_map`` adds its
    staged dQ tiles through: the float32 dQacc at ``ptr`` seen as (heads, rows, cols), boxes
    of one head's 64 rows x 32 columns (128 bytes, the 128-byte swizzle), so that rows past
    ``rows`` fall outside it. Cached as ``tensor_map_ptr``'s maps are."""
    key = ("dq", ptr, heads, rows, cols, device)
    m = _MAPS.get(key)
    if m is None:
        if ptr % 16 or cols % 32:
            raise ValueError(f"dQacc at {ptr:#x} with {cols} columns: 16-byte aligned, d % 32")
        from ._driver import encode_tensor_map

        m = _MAPS.put(key, encode_tensor_map(ptr, rows, cols, cols * 4, "float32", 64, 32, heads))
    return m


def _tma_args(ver, q3, k3, v3, d: int) -> tuple:
    """(qmap, kmap, vmap) over (B*H*N, d) views: Q boxes of 64 rows, K and V of Bc rows."""
    return (
        tensor_map_of(q3.reshape(-1, d), 64),
        tensor_map_of(k3.reshape(-1, d), ver.Bc(d)),
        tensor_map_of(v3.reshape(-1, d), ver.Bc(d)),
    )


def as_kernel_input(x, shape):
    """C-contiguous, 16-byte aligned (for the 16-byte loads), reshaped to (B*H, N, d).

    An array that is all three already is returned as it is (a view costs host time)."""
    if x.flags.c_contiguous and x.data.ptr % 16 == 0:
        return x if x.shape == tuple(shape) else x.reshape(shape)
    x = cp.ascontiguousarray(x)
    if x.data.ptr % 16:
        x = x.copy()
    return x.reshape(shape)


def launch(ver, q, k, v, O, lse, *, causal: bool, scale: float) -> None:
    """Run version ``ver`` on checked inputs, writing ``O (..., Nq, d)`` and ``lse (..., Nq)``.

    ``O`` and ``lse`` must be C-contiguous with q's leading dims; every element is
    written (tests fill them with NaN first to check that).
    """
    *lead, Nq, d = q.shape
    Nk = k.shape[-2]
    BH = math.prod(lead)
    if BH == 0 or Nq == 0:
        return
    if Nk == 0:  # no key to attend to: zeros, lse = -inf (no kernel launch)
        O.fill(0)
        lse.fill(-np.inf)
        return
    q3 = as_kernel_input(q, (BH, Nq, d))  # (B*H, Nq, d)
    k3 = as_kernel_input(k, (BH, Nk, d))  # (B*H, Nk, d)
    v3 = as_kernel_input(v, (BH, Nk, d))  # (B*H, Nk, d)
    if q3.dtype.itemsize == 2 and scale < 0:  # tensor-core kernels take the row max of raw
        q3 = (q3.view(cp.uint16) ^ np.uint16(0x8000)).view(q3.dtype)  # scores: flip q's sign
        scale = -scale
    O3 = O.reshape(BH, Nq, d)  # views: O and lse are contiguous
    lse2 = lse.reshape(BH, Nq)
    fn = get_function(ver, d, q.dtype)
    smem = ver.smem_bytes(d)
    sms = sm_count() if ver.persistent else 1  # a persistent grid's cap (others: unused)
    if MAX_PERSISTENT_BLOCKS is not None:
        sms = min(sms, MAX_PERSISTENT_BLOCKS)
    for b0 in range(0, BH, MAX_GRID_Y):
        b1 = min(BH, b0 + MAX_GRID_Y)
        chunk = (q3, k3, v3, O3, lse2)  # one chunk covers B*H: the arrays, not slices
        if (b0, b1) != (0, BH):
            chunk = tuple(x[b0:b1] for x in chunk)
        maps = _tma_args(ver, *chunk[:3], d) if ver.tma else ()
        heads = (np.int32(b1 - b0),) if ver.persistent else ()  # the work tiles' B*H
        fn(
            ver.grid(Nq, b1 - b0, sms),
            (ver.threads,),
            (
                *chunk,
                np.int32(Nq),
                np.int32(Nk),
                np.float32(scale),
                np.int32(causal),
                *maps,
                *heads,
            ),
            shared_mem=smem,
        )


def launch_grouped(ver, q, k, v, O, lse, *, G: int, causal: bool, scale: float) -> None:
    """Grouped K/V heads: ``q (..., Hkv * G, Nq, d)`` against ``k``, ``v (..., Hkv, Nk, d)``.

    Query head ``h`` uses K/V head ``h // G``. Viewed as ``(..., Hkv, G, Nq, d)``, the query
    heads with the same ``h % G = g`` form a tensor shaped like k and v, so one launch of the
    version per ``g`` computes them against the unchanged K/V (no copy of K or V; q's slice and
    O's slice are copied, they are the small tensors). ``G`` launches read each K/V head ``G``
    times, as ``G`` separate query heads would.
    """
    *lead, Hq, Nq, d = q.shape
    Hkv = Hq // G
    qg = q.reshape(*lead, Hkv, G, Nq, d)  # (..., Hkv, G, Nq, d) view
    Og = O.reshape(*lead, Hkv, G, Nq, d)  # views of the contiguous outputs
    lseg = lse.reshape(*lead, Hkv, G, Nq)
    O_g = cp.empty((*lead, Hkv, Nq, d), dtype=O.dtype)  # one group member's heads
    lse_g = cp.empty((*lead, Hkv, Nq), dtype=lse.dtype)
    for g in range(G):
        launch(ver, qg[..., g, :, :], k, v, O_g, lse_g, causal=causal, scale=scale)
        Og[..., g, :, :] = O_g
        lseg[..., g, :] = lse_g
