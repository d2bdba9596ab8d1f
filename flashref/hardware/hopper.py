"""Hopper's layouts as NumPy models: the 128-byte swizzle and the wgmma fragments.

The Hopper kernels (``flashref/kernels/common/hopper_common.cuh``) never address a tile element
by (row, column) either. Three layouts decide where things are, and this module writes
each down as a plain function, checked on the CPU by ``tests/gpu/test_hopper_model.py`` and on
an H200 by ``flashref/kernels/probes/probe_wgmma.cu`` (``flashref.bench.hopper_probe``):

* the **128-byte swizzle** of a shared-memory tile with 64 columns of 16-bit elements
  (rows of 128 bytes): 16-byte chunk ``j`` of row ``r`` is stored at chunk ``j ^ (r % 8)``
  of that row (``swizzle_offset``). TMA writes tiles this way and ``wgmma`` reads them.
  The 64- and 32-byte swizzles and no swizzle are modelled too, for telling them apart.
* the **accumulator fragments** of ``wgmma.mma_async.m64nNk16`` (``wgmma_c``): thread
  ``T`` of the warpgroup (warp ``w = T // 32``) holds rows 16 w .. 16 w + 15, and inside
  them the ``mma.sync`` m16n8k16 C layout once per 8 columns;
* the **A fragments** of the register form (``wgmma_a``): warp ``w`` holds rows 16 w ..
  16 w + 15 of the 64 x 16 A in the ``mma.sync`` A layout.

The TMA descriptor that makes a kernel's TMA copies write tiles this way is made by
``flashref.gpu.tma.tensor_map``; what the driver accepts of one (``check_tensor_map_args``:
element sizes, the box's limits, the alignment of rows and addresses) is written down here,
as the rest of Hopper's rules are, and the runtime checks its arguments with it.

NumPy only: a model of the chip. The runtime (``flashref.gpu.tma``) imports its TMA rules;
it imports nothing of ``flashref.gpu``.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_block

WARPGROUP = 128  # threads that issue one wgmma together
TILE_COLS = 64  # 16-bit elements per 128-byte swizzled row
ROW_BYTES = 128
CHUNK_BYTES = 16
SWIZZLES = {128: 8, 64: 4, 32: 2, 0: 1}  # swizzle span in bytes -> rows its pattern spans


ELEMENT_BYTES = {"float16": 2, "bfloat16": 2}
MAX_BOX = 256  # a TMA box has at most 256 elements along each dimension


def check_tensor_map_args(shape, dtype: str, strides, ptr: int, box_rows, box_cols=64) -> int:
    """The element size; or the error cuTensorMapEncodeTiled would give, in words.

    ``shape`` (rows, cols) and ``strides`` (bytes) of a 2-D array at address ``ptr``;
    the box is (box_rows, box_cols) elements, loaded with the 128-byte swizzle.
    """
    if dtype not in ELEMENT_BYTES:
        raise TypeError(f"x must be float16 or bfloat16 (TMA of 16-bit tiles), got {dtype}")
    size = ELEMENT_BYTES[dtype]
    if len(shape) != 2:
        raise ValueError(f"x must be 2-D (rows, cols), got shape {tuple(shape)}")
    rows, cols = shape
    if not (1 <= rows <= 2**32 and 1 <= cols <= 2**32):
        raise ValueError(f"x must have 1..2^32 rows and columns, got shape {tuple(shape)}")
    if strides[1] != size:
        raise ValueError(f"x must be row-major with contiguous rows, got strides {tuple(strides)}")
    if strides[0] % 16 or not 0 < strides[0] < 2**40:
        raise ValueError(
            f"x's row stride must be a positive multiple of 16 bytes (below 2^40), "
            f"got {strides[0]} bytes"
        )
    if ptr % 16:
        raise ValueError(f"x's data must start at a 16-byte aligned address, got {ptr:#x}")
    box_rows = check_block(box_rows, "box_rows", 1, MAX_BOX)
    box_cols = check_block(box_cols, "box_cols", 1, MAX_BOX)
    if box_cols * size % 16 or box_cols * size > ROW_BYTES:
        raise ValueError(
            f"box_cols * {size} bytes must be a multiple of 16 and at most 128 for the "
            f"128-byte swizzle, got box_cols={box_cols} ({box_cols * size} bytes)"
        )
    return size


def _indices(r, c) -> tuple[np.ndarray, np.ndarray]:
    r, c = np.asarray(r), np.asarray(c)
    for a, name in ((r, "r"), (c, "c")):
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if (r < 0).any():
        raise ValueError("r must be >= 0")
    if ((c < 0) | (c >= TILE_COLS)).any():
        raise ValueError(f"c must be in 0..{TILE_COLS - 1} (a swizzled row holds 64 elements)")
    return r.astype(np.int64), c.astype(np.int64)


# ------------------------------------------------------------------- the swizzled tile


def swizzle_offset(r, c, swizzle: int = 128) -> np.ndarray:
    """Byte offset of element (r, c) of a 64-column 16-bit tile in shared memory.

    ``swizzle`` 128 (the default), 64 or 32 bytes, or 0 for none: the 16-byte chunk index
    ``c // 8`` is XORed with ``r % 8``, ``r % 4`` or ``r % 2``. The tile starts at a
    1024-byte boundary (the pattern's period: 8 rows of 128 bytes).
    """
    if swizzle not in SWIZZLES:
        raise ValueError(f"swizzle must be one of {sorted(SWIZZLES)} (bytes), got {swizzle!r}")
    r, c = _indices(r, c)
    chunk = (c // 8) ^ (r % SWIZZLES[swizzle])
    return r * ROW_BYTES + chunk * CHUNK_BYTES + (c % 8) * 2


def swizzle128_offset(r, c) -> np.ndarray:
    """``swizzle_offset(r, c, 128)``: what ``swizzle128`` in hopper_common.cuh computes."""
    return swizzle_offset(r, c, 128)


def _tile(tile, name: str = "tile") -> np.ndarray:
    tile = np.asarray(tile)
    if tile.ndim != 2 or tile.shape[1] != TILE_COLS or tile.shape[0] < 1:
        raise ValueError(f"{name} must have shape (rows, 64) with rows >= 1, got {tile.shape}")
    return tile


def swizzle_tile(tile, swizzle: int = 128) -> np.ndarray:
    """The shared-memory image of ``tile`` (rows, 64): word i is the 16-bit element at byte 2i.

    Any dtype is accepted and moved as the 16-bit elements would be (the probe's diagnosis
    swizzles float64 copies of its tiles).
    """
    tile = _tile(tile)
    r, c = np.indices(tile.shape)  # each (rows, 64)
    image = np.empty(tile.size, dtype=tile.dtype)  # (rows * 64,)
    image[swizzle_offset(r, c, swizzle) // 2] = tile
    return image


def unswizzle_tile(image, rows: int, swizzle: int = 128) -> np.ndarray:
    """The tile (rows, 64) whose shared-memory image is ``image`` (inverse of swizzle_tile)."""
    rows = check_block(rows, "rows", 1)
    image = np.asarray(image)
    if image.shape != (rows * TILE_COLS,):
        raise ValueError(f"image must have shape ({rows * TILE_COLS},), got {image.shape}")
    r, c = np.indices((rows, TILE_COLS))
    return image[swizzle_offset(r, c, swizzle) // 2]  # (rows, 64)


def chunk_map(rows: int = 8, swizzle: int = 128) -> np.ndarray:
    """(rows, 8): the stored chunk position of logical chunk j of row r (for the figure)."""
    rows = check_block(rows, "rows", 1)
    r, j = np.indices((rows, TILE_COLS // 8))
    return swizzle_offset(r, 8 * j, swizzle) % ROW_BYTES // CHUNK_BYTES


# --------------------------------------------------------------- wgmma register layouts


def _n(n) -> int:
    if n not in (64, 128):
        raise ValueError(f"n must be 64 or 128 (the wgmma shapes of the kernels), got {n!r}")
    return n


def wgmma_c(thread, reg, n: int = 64) -> tuple[int, int]:
    """(row, col) of the D element (64 x n, fp32) in register d[reg] of ``thread`` (0..127).

    Warp w = thread // 32 holds rows 16 w + 0..15; with g = lane // 4, t = lane % 4, registers
    come in fours per 8 columns j = reg // 4: D[16w + g][8j + 2t + (reg % 2)] for reg % 4 < 2,
    the same 8 rows lower for reg % 4 >= 2 (PTX ISA, "Matrix Fragments for wgmma.m64nNk16").
    """
    n = _n(n)
    thread = check_block(thread, "thread", 0, WARPGROUP - 1)
    reg = check_block(reg, "reg", 0, n // 2 - 1)
    w, lane = divmod(thread, 32)
    g, t = divmod(lane, 4)
    return 16 * w + g + 8 * ((reg % 4) // 2), 8 * (reg // 4) + 2 * t + reg % 2


def wgmma_a(thread, reg, half) -> tuple[int, int]:
    """(row, k) of the A element (64 x 16, 16-bit) in half ``half`` of register a{reg}.

    Warp w holds rows 16 w + 0..15 in the mma.sync m16n8k16 A layout: a0 rows g, k 2t + half;
    a1 rows g + 8; a2 k + 8; a3 both (PTX ISA, "Matrix Fragments for wgmma.m64nNk16").
    """
    thread, reg = check_block(thread, "thread", 0, WARPGROUP - 1), check_block(reg, "reg", 0, 3)
    half = check_block(half, "half", 0, 1)
    w, lane = divmod(thread, 32)
    g, t = divmod(lane, 4)
    return 16 * w + g + 8 * (reg % 2), 2 * t + half + 8 * (reg // 2)


def wgmma_c_map(n: int = 64) -> np.ndarray:
    """src (128, n // 2, 2): the (row, col) of D that each thread's register holds."""
    n = _n(n)
    return np.array([[wgmma_c(T, i, n) for i in range(n // 2)] for T in range(WARPGROUP)])


def wgmma_a_map() -> np.ndarray:
    """src (128, 4, 2, 2): the (row, k) of A in each thread's register half."""
    return np.array(
        [[[wgmma_a(T, r, h) for h in range(2)] for r in range(4)] for T in range(WARPGROUP)]
    )


def place(raw, src, shape) -> np.ndarray:
    """The matrix of ``shape`` whose element src[i] is raw[i]; NaN where no register lands."""
    raw, src = np.asarray(raw, dtype=np.float64), np.asarray(src)
    if raw.shape != src.shape[:-1]:
        raise ValueError(f"raw has shape {raw.shape} but src holds {src.shape[:-1]} places")
    out = np.full(shape, np.nan)
    out[src[..., 0], src[..., 1]] = raw
    return out
