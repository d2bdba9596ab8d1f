"""Which warp works on which element of a tile: versions 2 and 3 of the forward kernel.

Version 2 (``v02_fp32_8warps.cu``, FlashAttention-1's way inside a block) spreads each of a
tile's three steps over its 256 threads in a different way; version 3 (``v03_mma.cu``,
FlashAttention-2's split) gives each warp its own rows for the whole tile. Each function
here walks the kernel's own thread indices and returns, for one step, an array of the
tile's shape holding the warp (``thread // 32``) that computes each element:

* ``v2_owners(step, d)``: step 1 writes S (64 x 64): thread ``tid`` with ``ty = tid / 16``,
  ``tx = tid % 16`` computes rows ``ty + 16 a`` and columns ``tx + 16 b``; step 2 (the
  softmax) gives row ``r = tid / 4`` to four neighbouring threads, each taking every
  fourth column ``j = tid % 4 + 4 i``; step 3 accumulates O (64 x d) in rows ``ty + 16 a``
  and columns ``tx + 16 b``.
* ``v3_owners(step, d)``: warp ``w`` holds rows ``16 w + g`` and ``16 w + g + 8`` of every
  accumulator tile (``fragments.mma_c``), of S (64 x 64) and O (64 x d), in every step.

``exchanged(a, b)`` counts the elements whose warp changes from one step to the next: each
is a value that went through shared memory, behind a ``__syncthreads()``.
``flashref.hardware.kernel_figures.draw_warp_split`` draws them. Pure NumPy.
"""

from __future__ import annotations

import numpy as np

from .fragments import WARP_SIZE, mma_c

BR, BC = 64, 64  # query rows and keys of a tile, in both versions
V2_THREADS, V3_WARPS = 256, 4
STEPS = {1: "$S = QK^T$", 2: "softmax", 3: "$O = \\alpha O + PV$"}


def _step(step) -> int:
    if step not in STEPS:
        raise ValueError(f"step must be one of {sorted(STEPS)}, got {step!r}")
    return step


def _dim(d) -> int:
    if isinstance(d, bool) or not isinstance(d, int) or not 16 <= d <= 128 or d % 16:
        raise ValueError(f"d must be a multiple of 16 from 16 to 128, got {d!r}")
    return d


def v2_owners(step, d: int = 64) -> np.ndarray:
    """(64, 64) for steps 1 and 2 (S), (64, d) for step 3 (O): the warp of each element."""
    _step(step), _dim(d)
    cols = d if step == 3 else BC
    owner = np.full((BR, cols), -1, dtype=np.int64)  # (Br, Bc or d)
    for tid in range(V2_THREADS):
        warp = tid // WARP_SIZE
        if step == 2:  # r = tid / 4, part = tid % 4; j = part, part + 4, ...
            owner[tid // 4, tid % 4 :: 4] = warp
            continue
        ty, tx = tid // 16, tid % 16
        for a in range(BR // 16):  # RA rows per thread
            owner[ty + 16 * a, tx::16] = warp  # columns tx + 16 b
    return owner


def v3_owners(step, d: int = 64) -> np.ndarray:
    """(64, 64) for steps 1 and 2 (S), (64, d) for step 3 (O): the warp of each element.

    Built from the accumulator layout: warp w's accumulator tile n (16 x 8) covers rows
    16 w .. 16 w + 15 and columns 8 n .. 8 n + 7, lane L holding ``mma_c(L, reg)``.
    """
    _step(step), _dim(d)
    cols = d if step == 3 else BC
    owner = np.full((BR, cols), -1, dtype=np.int64)  # (Br, Bc or d)
    for warp in range(V3_WARPS):
        for n in range(cols // 8):  # accumulator tiles s[n] or o[n]
            for lane in range(WARP_SIZE):
                for reg in range(4):
                    row, col = mma_c(lane, reg)
                    owner[16 * warp + row, 8 * n + col] = warp
    return owner


def owners(version, step, d: int = 64) -> np.ndarray:
    """``v2_owners`` or ``v3_owners`` by version number (2 or 3)."""
    if version not in (2, 3):
        raise ValueError(f"version must be 2 or 3, got {version!r}")
    return (v2_owners if version == 2 else v3_owners)(step, d)


def rows_of(owner: np.ndarray, warp: int) -> list[int]:
    """The rows in which ``warp`` computes at least one element."""
    return [int(r) for r in np.flatnonzero((np.asarray(owner) == warp).any(axis=1))]


def exchanged(before: np.ndarray, after: np.ndarray) -> int:
    """How many elements of S a different warp works on in ``after`` than in ``before``.

    Both must be maps of the same S tile (steps 1 and 2); for O against P (step 3), compare
    the rows: ``rows_of``.
    """
    before, after = np.asarray(before), np.asarray(after)
    if before.shape != after.shape:
        raise ValueError(f"the maps differ in shape: {before.shape} and {after.shape}")
    return int((before != after).sum())
