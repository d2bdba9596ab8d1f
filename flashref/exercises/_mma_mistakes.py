"""The mistakes the ``mma.sync`` fragment checker knows, each the map a reader might write.

An answer is a ``(row, col)`` pair of ints, so a mistake is recognised by giving exactly the
reader's answer at every point of a case. The right answers are
``flashref.hardware.fragments.mma_a`` and ``mma_c``; each wrong map below is the right
one, written as a formula in ``g = lane // 4`` and ``t = lane % 4``, with one thing changed.
"""

from __future__ import annotations

SWAPPED = (
    "rows and columns swapped: a quad of lanes (the same g = lane // 4) shares a row, "
    "row g, and each lane holds neighbouring columns 2 t and 2 t + 1"
)
NO_ROW_8 = (
    "no + 8 for the lower rows: the registers a1 and a3 of A (c2 and c3 of C) hold rows "
    "8-15, row g + 8"
)
NO_COL_8 = "no + 8 for the right half: a2 and a3 hold columns (k) 8-15, column 2 t + 8 + half"
G_T_SWAPPED = (
    "lane group g and t swapped: g = lane // 4 (0..7) picks the row and t = lane % 4 "
    "(0..3) the pair of columns, so lanes 0-3 share row 0"
)
A_REG_ORDER = (
    "a1 and a2 swapped: the registers go down before they go right, a0 rows 0-7, "
    "a1 rows 8-15 (both k 0-7), then a2 and a3 for k 8-15"
)
NOT_PAIRED = (
    "a lane's two values of one row are neighbours, columns 2 t and 2 t + 1 (a pair that "
    "packs into one 32-bit register), not t and t + 4"
)
C_REG_ORDER = (
    "C's registers in A's order: c0 and c1 are a pair of neighbouring columns of row g, "
    "c2 and c3 the same columns of row g + 8"
)


def _gt(lane: int) -> tuple[int, int]:
    return lane // 4, lane % 4


def a_candidates(operand: str, lane: int, reg: int, half: int) -> list[tuple[str, tuple]]:
    """(name, (row, col)) of every mistake for element ``half`` of register a{reg}."""
    g, t = _gt(lane)
    row, col = g + 8 * (reg % 2), 2 * t + half + 8 * (reg // 2)
    return [
        (SWAPPED, (col, row)),
        (NO_ROW_8, (g, col)),
        (NO_COL_8, (row, 2 * t + half)),
        (G_T_SWAPPED, (t + 8 * (reg % 2), 2 * g + half + 8 * (reg // 2))),
        (A_REG_ORDER, (g + 8 * (reg // 2), 2 * t + half + 8 * (reg % 2))),
        (NOT_PAIRED, (row, t + 4 * half + 8 * (reg // 2))),
    ]


def c_candidates(operand: str, lane: int, reg: int, half: int) -> list[tuple[str, tuple]]:
    """(name, (row, col)) of every mistake for register c{reg} (one fp32, ``half`` = 0)."""
    g, t = _gt(lane)
    row, col = g + 8 * (reg // 2), 2 * t + reg % 2
    return [
        (SWAPPED, (col, row)),
        (NO_ROW_8, (g, col)),
        (G_T_SWAPPED, (t + 8 * (reg // 2), 2 * g + reg % 2)),
        (C_REG_ORDER, (g + 8 * (reg % 2), 2 * t + reg // 2)),
        (NOT_PAIRED, (row, t + 4 * (reg % 2))),
    ]
