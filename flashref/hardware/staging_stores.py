"""The wavefronts of the backward's dQ staging stores, versions 16 to 19 (chapter 8).

Each consumer thread of those versions stores its dQ_i accumulator into the staging buffer
with ``st.shared.v2.f32`` (8 bytes a lane). The buffer is d / 32 boxes of 64 rows x 32
floats, each in the 128-byte swizzle: the 16-byte chunk k of row r is at chunk
``k ^ (r % 8)`` (``dq_stage_addr`` in the kernels). Lane ``4 g + t`` of warp ``w`` holds,
for each 8-column group n and half h, columns ``8 n + 2 t`` and ``+ 1`` of row
``16 w + g + 8 h`` (the mma.sync C layout per 8 columns):

* versions 16 and 18 split dQ_i by columns: consumer cw stores rows ``16 w + g + 8 h``,
  columns ``(d / 2) cw + 8 n + 2 t`` (``d / 16`` groups);
* versions 17 and 19 split it by rows: consumer cw stores rows ``64 cw + 16 w + g + 8 h``,
  columns ``8 n + 2 t`` (``d / 8`` groups);
* versions 18 and 19 store group ``n ^ 2`` from lanes ``t = 2, 3`` in the instruction where
  lanes ``t = 0, 1`` store group n.

Shared memory has 32 banks of 4 bytes (``banks.BANKS``). The model: a 64-bit store is
served a half-warp (128 bytes) at a time, each half-warp in as many wavefronts as the
most distinct 4-byte words any one bank must take; the fewest for a warp's 256 bytes is
two. ``results/gpu_backward_profile.json`` counts the extra ones as bank conflicts of
stores (``l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum``); chapter 8 prints the
two side by side. Pure NumPy.
"""

from __future__ import annotations

import numpy as np

from .banks import BANK_BYTES, BANKS
from .fragments import WARP_SIZE

VERSIONS = (16, 17, 18, 19)
ROWS_SPLIT = (17, 19)  # Br = 128: dQ_i split by rows between the two consumers
REORDERED = (18, 19)  # lanes t = 2, 3 store group n ^ 2
STORE_BYTES = 8  # st.shared.v2.f32
BOX_BYTES = 64 * 128  # one staged box: 64 rows x 32 floats
CONSUMER_WARPS = 8  # two consumer warpgroups
KEYS_PER_BLOCK = 128


def _version(version) -> int:
    if isinstance(version, bool) or version not in VERSIONS:
        raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
    return version


def _head_dim(version: int, d) -> int:
    dims = (64,) if version in ROWS_SPLIT else (64, 128)
    if isinstance(d, bool) or d not in dims:
        raise ValueError(f"d must be one of {dims} for version {version}, got {d!r}")
    return d


def stage_offset(row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """The byte offset in the staging buffer of (row, col), col even: box col // 32, its
    16-byte chunk (col % 32) // 4 swizzled with the row, as the tensor map reads it."""
    row, col = np.asarray(row), np.asarray(col)
    chunk = ((col % 32) // 4) ^ (row % 8)
    return (col // 32) * BOX_BYTES + row * 128 + chunk * 16 + (col % 4) * 4


def groups(version: int, d: int) -> int:
    """The 8-column groups each thread stores per tile and row half."""
    version = _version(version)
    d = _head_dim(version, d)
    return d // 8 if version in ROWS_SPLIT else d // 16


def store_offsets(version: int, d: int, n: int, h: int, warp: int = 0, cw: int = 0):
    """(32,) the byte offset each lane of consumer ``cw``'s warp ``warp`` stores at in the
    instruction of group ``n`` and row half ``h``."""
    version = _version(version)
    count = groups(version, d)
    if not 0 <= n < count or h not in (0, 1) or not 0 <= warp < 4 or cw not in (0, 1):
        raise ValueError(f"n, h, warp, cw = {(n, h, warp, cw)} out of range (n < {count})")
    lane = np.arange(WARP_SIZE)
    g, t = lane // 4, lane % 4
    m = np.where(t >= 2, n ^ 2, n) if version in REORDERED else np.full(WARP_SIZE, n)
    row = 16 * warp + g + 8 * h
    if version in ROWS_SPLIT:
        return stage_offset(64 * cw + row, 8 * m + 2 * t)
    return stage_offset(row, (d // 2) * cw + 8 * m + 2 * t)


def wavefronts(offsets: np.ndarray, nbytes: int = STORE_BYTES) -> int:
    """The wavefronts of one warp's store of ``nbytes`` a lane at ``offsets`` (32,): per
    half-warp, the most distinct words any one bank takes."""
    offsets = np.asarray(offsets)
    if offsets.shape != (WARP_SIZE,):
        raise ValueError(f"offsets must have shape ({WARP_SIZE},), got {offsets.shape}")
    total = 0
    for half in (offsets[:16], offsets[16:]):
        words = np.unique(half[:, None] // BANK_BYTES + np.arange(nbytes // BANK_BYTES))
        total += int(np.bincount(words % BANKS, minlength=BANKS).max())
    return total


def wavefronts_per_store(version: int, d: int) -> set[int]:
    """The wavefronts of every store instruction of a tile (every group, half, warp and
    consumer), as a set: one value when all take the same."""
    return {
        wavefronts(store_offsets(version, d, n, h, w, cw))
        for n in range(groups(version, d))
        for h in (0, 1)
        for w in range(4)
        for cw in (0, 1)
    }


def stores(version: int, d: int, B: int, H: int, N: int) -> int:
    """Store instructions (warp-wide) of one call without the causal mask, Nq = Nk = N:
    every key block (128 keys) visits every query tile (Br = 128 for versions 17 and 19,
    else 64), and each of its eight consumer warps stores 2 x ``groups`` times a tile."""
    version = _version(version)
    br = 128 if version in ROWS_SPLIT else 64
    blocks = B * H * -(-N // KEYS_PER_BLOCK)
    return blocks * -(-N // br) * CONSUMER_WARPS * 2 * groups(version, d)


def extra_wavefronts(version: int, d: int, B: int, H: int, N: int) -> int:
    """The wavefronts beyond two per store, over one call: what the profiler counts as
    bank conflicts of these stores."""
    (per,) = wavefronts_per_store(version, d)
    return stores(version, d, B, H, N) * (per - 2)


__all__ = [
    "VERSIONS",
    "stage_offset",
    "groups",
    "store_offsets",
    "wavefronts",
    "wavefronts_per_store",
    "stores",
    "extra_wavefronts",
]
