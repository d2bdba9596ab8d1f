"""Which shared-memory banks an ``ldmatrix`` reads, with and without version 4's padding.

Shared memory is 32 banks of 4 bytes: the 4-byte word at byte address ``a`` is in bank
``(a // 4) % 32``. A warp's request is served in one pass (a "wavefront") only if no two
of the words it needs lie in the same bank; otherwise it is split into as many passes as
the most distinct words any one bank must deliver (the same word, read by several lanes,
is sent to all of them in one pass). ``ldmatrix.x4`` reads four 8 x 8 matrices, 128 bytes
each, one matrix per pass at best: the 8 lanes ``8 m .. 8 m + 7`` give the start of its
8 rows of 16 bytes (``fragments.ldmatrix_x4_row_lane``).

The kernels' addresses are ``tile + row * LDS + col`` in 16-bit elements, ``row`` and
``col`` from ``fragments.q_address``, ``k_address`` or ``v_address``; version 3 has
``LDS = d`` (rows of 128 or 256 bytes, every row starting in bank 0), version 4 onwards
``LDS = d + 8`` (16 bytes more, so row r starts 4 r banks along):

* ``row_banks(address, lds)``: (32, 4) the banks of the 16 bytes each lane's row covers;
* ``passes(address, lds)``: (4,) the passes each of the four matrices takes;
the row stride each version uses is the registry's (``flashref.gpu.forward_versions.lds_of``).

``flashref.hardware.kernel_figures.draw_bank_map`` draws one matrix's rows on the banks.
Pure NumPy.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .fragments import WARP_SIZE, row_starts

BANKS, BANK_BYTES = 32, 4
ELEMENT_BYTES = 2  # fp16 and bf16
ROW_BYTES = 16  # one ldmatrix row: 8 elements


def _lds(lds) -> int:
    if isinstance(lds, bool) or not isinstance(lds, int) or lds < 8 or lds % 8:
        raise ValueError(f"lds must be a row stride in elements, a multiple of 8, got {lds!r}")
    return lds


def row_bytes(address: Callable[[int], tuple[int, int]], lds: int) -> np.ndarray:
    """(32,) the byte offset from the tile's start of each lane's 16-byte row."""
    rows = row_starts(address)  # (32, 2): (row, col) in elements
    return (rows[:, 0] * _lds(lds) + rows[:, 1]) * ELEMENT_BYTES  # (32,)


def row_banks(address: Callable[[int], tuple[int, int]], lds: int) -> np.ndarray:
    """(32, 4): the bank of each of the four 4-byte words of each lane's 16-byte row."""
    start = row_bytes(address, lds)  # (32,)
    words = start[:, None] // BANK_BYTES + np.arange(ROW_BYTES // BANK_BYTES)  # (32, 4)
    return words % BANKS


def passes(address: Callable[[int], tuple[int, int]], lds: int) -> np.ndarray:
    """(4,): the passes (wavefronts) each matrix of an ``ldmatrix.x4`` at ``address`` takes.

    1 is conflict-free; n means an n-way bank conflict.
    """
    start = row_bytes(address, lds)  # (32,)
    words = start[:, None] // BANK_BYTES + np.arange(ROW_BYTES // BANK_BYTES)  # (32, 4)
    out = np.empty(4, dtype=np.int64)
    for m in range(4):
        mine = np.unique(words[8 * m : 8 * m + 8])  # distinct words of this matrix
        out[m] = np.bincount(mine % BANKS, minlength=BANKS).max()
    return out


__all__ = ["BANKS", "BANK_BYTES", "WARP_SIZE", "row_bytes", "row_banks", "passes"]
