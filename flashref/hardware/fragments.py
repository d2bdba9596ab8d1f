"""Who holds which element: the register layouts of ``mma.m16n8k16`` and ``ldmatrix``.

From version 3 on, a kernel never names a matrix element by its row and column.
A warp's 32 lanes each hold a few registers, and the PTX instructions fix which
element of a tile lands in which register of which lane. This module writes those
layouts down as plain functions, ``(lane, reg, half) -> (row, col)``, for

* the A (16 x 16, row-major fp16), B (16 x 8, "col" fp16) and C/D (16 x 8, fp32)
  operands of ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``,
* ``ldmatrix.sync.aligned.m8n8.x4.shared.b16`` and its ``.trans`` form,

and then checks the kernels' address arithmetic: the three ``ldmatrix.x4`` calls of
``flashref/kernels/forward/v03_mma.cu`` to ``v11_three_stage.cu`` leave in every lane exactly
the registers that ``mma`` expects from it (``check_load``, ``describe_load``).

Everything is built from one 8 x 8 layout, ldmatrix's: lane L holds row L // 4,
columns 2 (L % 4) and 2 (L % 4) + 1, two fp16 in one 32-bit register (``half`` 0 is
the low 16 bits). A is four such blocks, one register each; B (as B^T) two; C two,
a pair of fp32 registers each. The PTX ISA states the same layouts as formulas in
groupID = lane >> 2 and threadID_in_group = lane % 4 (sections "Matrix Fragments for
mma.m16n8k16 with floating point type" and "ldmatrix"); ``tests/gpu/test_fragments.py``
checks this module against those formulas, and on a GPU against
``kernels/probes/probe_fragments.cu``.

Pure Python and NumPy: importing it imports no CuPy. The pictures drawn from these
maps are in ``flashref.hardware.fragment_figures``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

WARP_SIZE = 32
# registers per lane and fp16 halves per register; C holds one fp32 per register
SHAPES = {"A": (16, 16), "B": (16, 8), "C": (16, 8)}
REGS = {"A": 4, "B": 2, "C": 4}
HALVES = {"A": 2, "B": 2, "C": 1}


def _index(value, name: str, n: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value < n:
        raise ValueError(f"{name} must be in 0..{n - 1}, got {value}")
    return int(value)


def _block8x8(lane: int, half: int) -> tuple[int, int]:
    """(row, col) in one 8 x 8 block: a quad of lanes shares a row, two columns each."""
    return lane // 4, 2 * (lane % 4) + half


# ---------------------------------------------------------------- mma.m16n8k16 operands


def mma_a(lane, reg, half) -> tuple[int, int]:
    """(row, k) of the A element (16 x 16) in half ``half`` of register a{reg} of ``lane``.

    a0: rows 0-7, k 0-7; a1: rows 8-15, k 0-7; a2: rows 0-7, k 8-15; a3: rows 8-15, k 8-15.
    """
    lane, reg = _index(lane, "lane", WARP_SIZE), _index(reg, "reg", 4)
    row, col = _block8x8(lane, _index(half, "half", 2))
    return row + 8 * (reg % 2), col + 8 * (reg // 2)


def mma_b(lane, reg, half) -> tuple[int, int]:
    """(k, n) of the B element (16 x 8) in half ``half`` of register b{reg} of ``lane``.

    B is "col": the 8 x 8 block layout applies to B^T (n, k), so a lane holds one
    column n = lane // 4 and two neighbouring k. b0: k 0-7; b1: k 8-15.
    """
    lane, reg = _index(lane, "lane", WARP_SIZE), _index(reg, "reg", 2)
    n, k = _block8x8(lane, _index(half, "half", 2))
    return k + 8 * reg, n


def mma_c(lane, reg) -> tuple[int, int]:
    """(row, n) of the C/D element (16 x 8, fp32) in register c{reg} of ``lane``.

    c0, c1 are one 8 x 8 block's pair (rows 0-7), c2, c3 the next (rows 8-15): the
    pairs are laid out like A's registers, which is why two neighbouring C tiles of
    S, rounded to fp16 in pairs, are the A operand of P V (``a_from_c``).
    """
    lane, reg = _index(lane, "lane", WARP_SIZE), _index(reg, "reg", 4)
    row, n = _block8x8(lane, reg % 2)
    return row + 8 * (reg // 2), n


def a_from_c(reg) -> tuple[int, int, int]:
    """(tile, c_lo, c_hi) of the kernels' ``a{reg} = pack_half2(s[2 kk + tile][c_lo], ..[c_hi])``.

    Register a{reg} of the A operand of P V for key slice kk holds the C pair
    (c_lo, c_hi) of accumulator tile 2 kk + tile of S, rounded to fp16.
    """
    reg = _index(reg, "reg", 4)
    return reg // 2, 2 * (reg % 2), 2 * (reg % 2) + 1


# ---------------------------------------------------------------- ldmatrix.x4


def ldmatrix_x4_row_lane(matrix, row) -> int:
    """The lane whose address is the start of row ``row`` of matrix ``matrix`` (0..3)."""
    return 8 * _index(matrix, "matrix", 4) + _index(row, "row", 8)


def ldmatrix_x4(lane, reg, half, trans=False) -> tuple[int, int, int]:
    """(matrix, row, col) that half ``half`` of register r{reg} of ``lane`` receives.

    ``row`` is a row as addressed (its start is the address of lane 8 matrix + row),
    ``col`` the position along those 16 bytes. Register r{m} holds matrix m. Without
    ``.trans`` the 8 x 8 block is taken as stored; with ``.trans`` as its transpose.
    """
    lane, reg = _index(lane, "lane", WARP_SIZE), _index(reg, "reg", 4)
    if not isinstance(trans, bool):
        raise TypeError(f"trans must be a bool, got {type(trans).__name__}")
    row, col = _block8x8(lane, _index(half, "half", 2))
    return (reg, col, row) if trans else (reg, row, col)


# ------------------------------------------- the kernels' addresses (row, column of a tile)
# Each returns the (row, column) in halves of the 16-byte row that ``lane`` points at:
# address = tile + row * LDS + column. Offsets are those of the kernels' loops.


def q_address(lane, row0=0, k0=0) -> tuple[int, int]:
    """``Qs + (row0 + lane % 16) * LDS + k0 + (lane / 16) * 8``; row0: the warp's first row."""
    lane = _index(lane, "lane", WARP_SIZE)
    return row0 + lane % 16, k0 + (lane // 16) * 8


def k_address(lane, j=0, k0=0) -> tuple[int, int]:
    """``Ks + (j * 8 + (lane % 8) + (lane / 16) * 8) * LDS + k0 + ((lane / 8) % 2) * 8``."""
    lane = _index(lane, "lane", WARP_SIZE)
    return j * 8 + lane % 8 + (lane // 16) * 8, k0 + ((lane // 8) % 2) * 8


def v_address(lane, kk=0, n=0) -> tuple[int, int]:
    """``Vs + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LDS + n * 8 + (lane / 16) * 8``."""
    lane = _index(lane, "lane", WARP_SIZE)
    return kk * 16 + lane % 8 + ((lane // 8) % 2) * 8, n * 8 + (lane // 16) * 8


def row_starts(address) -> np.ndarray:
    """(32, 2): the (row, col) that each lane's address points at."""
    if not callable(address):
        raise TypeError(f"address must be a function of the lane, got {type(address).__name__}")
    rows = np.array([address(lane) for lane in range(WARP_SIZE)])  # (32, 2)
    if rows.shape != (WARP_SIZE, 2) or rows.dtype.kind not in "iu" or (rows < 0).any():
        raise ValueError("address(lane) must return (row, column), two ints >= 0, for each lane")
    return rows


def ldmatrix_x4_load(address: Callable[[int], tuple[int, int]], trans=False) -> np.ndarray:
    """Where each register half comes from when lane L passes ``address(L)``.

    Returns src (32, 4, 2, 2): src[lane, reg, half] = (row, col) in the tile.
    """
    rows = row_starts(address)  # (32, 2): (row, col) of each lane's 16-byte row
    src = np.empty((WARP_SIZE, 4, 2, 2), dtype=np.int64)  # (lane, reg, half, 2)
    for lane in range(WARP_SIZE):
        for reg in range(4):
            for half in range(2):
                matrix, r, c = ldmatrix_x4(lane, reg, half, trans)
                row, col = rows[ldmatrix_x4_row_lane(matrix, r)]
                src[lane, reg, half] = row, col + c
    return src


def ldmatrix_x4_blocks(address: Callable[[int], tuple[int, int]]) -> np.ndarray:
    """(row, col) of the top-left corner of the 8 x 8 block each of the 4 matrices is.

    Raises ValueError if the 8 lanes of a matrix do not point at 8 consecutive rows
    of one column block (ldmatrix allows that; the kernels never do it).
    """
    starts = row_starts(address).reshape(4, 8, 2)  # (matrix, row, 2)
    consecutive = (starts[:, :, 0] == starts[:, :1, 0] + np.arange(8)).all(axis=1)  # (4,)
    one_column = (starts[:, :, 1] == starts[:, :1, 1]).all(axis=1)  # (4,)
    bad = np.flatnonzero(~(consecutive & one_column))
    if bad.size:
        m = int(bad[0])
        raise ValueError(f"address: lanes {8 * m}-{8 * m + 7} do not point at one 8 x 8 block")
    return starts[:, 0]  # (4, 2)


def fragment_map(operand: str) -> np.ndarray:
    """src (32, REGS, HALVES, 2): the (row, col) of the mma operand each lane holds."""
    if operand not in SHAPES:
        raise ValueError(f"operand must be one of {sorted(SHAPES)}, got {operand!r}")
    src = np.empty((WARP_SIZE, REGS[operand], HALVES[operand], 2), dtype=np.int64)
    for lane in range(WARP_SIZE):
        for reg in range(REGS[operand]):
            for half in range(HALVES[operand]):
                if operand == "C":
                    src[lane, reg, half] = mma_c(lane, reg)
                else:
                    src[lane, reg, half] = (mma_a if operand == "A" else mma_b)(lane, reg, half)
    return src


def owners(src: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """Inverse maps for drawing: owner_lane, owner_reg, owner_half, each of ``shape``.

    -1 marks an element no lane holds; ValueError if two hold the same element.
    """
    src = np.asarray(src)
    if src.ndim != 4 or src.shape[0] != WARP_SIZE or src.shape[-1] != 2:
        raise ValueError(f"src must have shape (32, regs, halves, 2), got {src.shape}")
    if (src < 0).any() or (src[..., 0] >= shape[0]).any() or (src[..., 1] >= shape[1]).any():
        raise ValueError(f"src holds a (row, col) outside shape {shape}")
    lane_of, reg_of, half_of = (np.full(shape, -1, dtype=np.int64) for _ in range(3))
    for (lane, reg, half), _ in np.ndenumerate(src[..., 0]):
        row, col = src[lane, reg, half]
        if lane_of[row, col] >= 0:
            raise ValueError(f"src: element ({row}, {col}) is held twice")
        lane_of[row, col], reg_of[row, col], half_of[row, col] = lane, reg, half
    return lane_of, reg_of, half_of


# ------------------------------------------------ the three loads of versions 3 to 11


@dataclass(frozen=True)
class KernelLoad:
    """One ``ldmatrix.x4`` of the kernels and the mma registers it must produce."""

    name: str
    role: str
    source: str  # the address as in the .cu files; row0, k0, j, kk, n are loop offsets
    address: Callable[[int], tuple[int, int]]
    trans: bool
    operand: str  # "A" or "B"
    rows_are_n: bool  # B operand stored [n][k] (K_j as [key][d]) rather than [k][n]
    registers: tuple[str, str, str, str]  # what r0..r3 are for the mma calls

    def expected(self) -> np.ndarray:
        """src (32, 4, 2, 2): the tile element each register half must hold for the mma.

        A: the A map itself (tile row = row, tile column = k). B: r0, r1 are b0, b1 of
        one n8 tile and r2, r3 of the next (n + 8); K_j lies in the tile as [key = n][d = k],
        V_j as [key = k][d = n].
        """
        frag = fragment_map(self.operand)  # (32, 4 or 2, 2, 2)
        if self.operand == "A":  # tile row = row, tile column = k
            return frag
        kn = np.concatenate([frag, frag + [0, 8]], axis=1)  # (32, 4, 2, 2): r2, r3 = n + 8
        k, n = kn[..., 0], kn[..., 1]
        return np.stack([n, k] if self.rows_are_n else [k, n], axis=-1)


KERNEL_LOADS = {
    "Q": KernelLoad(
        name="Q",
        role="Q_i (queries x d), the A operand of S = Q_i K_j^T",
        source="Qs + (row0 + lane % 16) * LDS + k0 + (lane / 16) * 8",
        address=q_address,
        trans=False,
        operand="A",
        rows_are_n=False,
        registers=("a0", "a1", "a2", "a3"),
    ),
    "K": KernelLoad(
        name="K",
        role="K_j (keys x d), the B operand of S = Q_i K_j^T",
        source="Ks + (j * 8 + (lane % 8) + (lane / 16) * 8) * LDS + k0 + ((lane / 8) % 2) * 8",
        address=k_address,
        trans=False,
        operand="B",
        rows_are_n=True,
        registers=(
            "b0 of key tile j",
            "b1 of key tile j",
            "b0 of key tile j+1",
            "b1 of key tile j+1",
        ),
    ),
    "V": KernelLoad(
        name="V",
        role="V_j (keys x d), the B operand of O += P V_j",
        source="Vs + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LDS + n * 8 + (lane / 16) * 8",
        address=v_address,
        trans=True,
        operand="B",
        rows_are_n=False,
        registers=("b0 of d tile n", "b1 of d tile n", "b0 of d tile n+1", "b1 of d tile n+1"),
    ),
}


def kernel_load(name) -> KernelLoad:
    """``KERNEL_LOADS[name]``, or a ValueError naming the three loads."""
    if name not in KERNEL_LOADS:
        raise ValueError(f"name must be one of {sorted(KERNEL_LOADS)}, got {name!r}")
    return KERNEL_LOADS[name]


def check_load(name: str) -> bool:
    """True if load ``name`` ("Q", "K" or "V") fills every lane's mma registers exactly."""
    load = kernel_load(name)
    return bool(np.array_equal(ldmatrix_x4_load(load.address, load.trans), load.expected()))


def describe_load(name: str) -> str:
    """Which 8 x 8 blocks load ``name`` reads, which lanes point at them, where they land."""
    load = kernel_load(name)
    instr = "ldmatrix.x4.trans" if load.trans else "ldmatrix.x4"
    lines = [f"{load.role}:", f"  {instr} at {load.source}"]
    for m, (row, col) in enumerate(ldmatrix_x4_blocks(load.address)):
        lines.append(
            f"  lanes {8 * m:2d}-{8 * m + 7:2d} -> rows {row:2d}-{row + 7:2d}, "
            f"columns {col:2d}-{col + 7:2d}: matrix {m} -> {load.registers[m]}"
        )
    verdict = check_load(name)
    lines.append(f"  every lane's registers are its mma {load.operand} fragments: {verdict}")
    return "\n".join(lines)
