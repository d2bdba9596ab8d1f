"""Pictures of the register layouts in ``flashref.hardware.fragments``, drawn from its maps.

``draw_mma("A")``, ``draw_mma("B", "C")``: who holds each element of the
``mma.m16n8k16`` operands. ``draw_load("Q")`` (or "K", "V"): one of the kernels'
``ldmatrix.x4`` loads, the lane whose address starts each row, and where each
element lands. Every cell is coloured by the lane that holds it: one hue per
group g = lane >> 2 (the row a quad of lanes shares), lighter as t = lane & 3
grows. The figures are sized for the book's page (8 inches at 100 dpi, 800 pixels).

matplotlib is imported inside the functions (a book and test dependency, not one
of the library). Each returns a pyplot figure, so a notebook shows it like any
other (``plt.show()``); ``fig.savefig(path)`` writes it, ``plt.close(fig)`` frees it.
"""

from __future__ import annotations

import numpy as np

from .fragments import (
    HALVES,
    SHAPES,
    WARP_SIZE,
    fragment_map,
    kernel_load,
    ldmatrix_x4_load,
    owners,
)

WIDTH_IN, DPI = 8.0, 100  # the book's page: about 800 pixels


def lane_colours() -> np.ndarray:
    """(32, 3) RGB: one hue per group g = lane // 4, lighter as t = lane % 4 grows."""
    from matplotlib import colormaps

    hues = np.array(colormaps["tab10"].colors)[[0, 1, 2, 3, 4, 5, 6, 9]]  # (8, 3), no grey/olive
    g, t = np.divmod(np.arange(WARP_SIZE), 4)
    return hues[g] + (1 - hues[g]) * (0.25 + 0.2 * t)[:, None]  # (32, 3)


def _labels(lane_of, reg_of, half_of, letter: str, halves: int) -> np.ndarray:
    """ "T{lane}" over "{letter}{reg}.{half}" (no half for fp32) for every cell."""
    labels = np.empty(lane_of.shape, dtype=object)
    for (r, c), lane in np.ndenumerate(lane_of):
        half = f".{half_of[r, c]}" if halves == 2 else ""
        labels[r, c] = f"T{lane}\n{letter}{reg_of[r, c]}{half}"
    return labels


def _grid(ax, lane_of, labels, x0: float, fontsize: float, col0: int = 0) -> None:
    """Cells coloured by owner lane, labelled; thick lines around each 8 x 8 block."""
    from matplotlib.patches import Rectangle

    colours = lane_colours()
    rows, cols = lane_of.shape
    for (r, c), lane in np.ndenumerate(lane_of):
        ax.add_patch(Rectangle((x0 + c, r), 1, 1, facecolor=colours[lane], edgecolor="white"))
        ax.text(
            x0 + c + 0.5,
            r + 0.5,
            labels[r, c],
            ha="center",
            va="center",
            fontsize=fontsize,
            linespacing=1.1,
        )
    for r in range(0, rows + 1, 8):
        ax.plot([x0, x0 + cols], [r, r], color="black", lw=1.5)
    for c in range(0, cols + 1, 8):
        ax.plot([x0 + c, x0 + c], [0, rows], color="black", lw=1.5)
    for c in range(cols):
        ax.text(x0 + c + 0.5, -0.3, str(col0 + c), ha="center", va="bottom", fontsize=fontsize)


def _figure(units_wide: float, rows: int):
    import matplotlib.pyplot as plt

    units_wide += 0.3  # right margin
    cell = WIDTH_IN / units_wide  # inches per cell
    fig = plt.figure(figsize=(WIDTH_IN, cell * (rows + 2.2)), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, units_wide)
    ax.set_ylim(rows + 0.2, -2.0)  # row 0 on top, room for titles and column numbers
    ax.axis("off")
    return fig, ax, min(7.5, 72 * cell * 0.27)  # font size in points that fits "T31"


def draw_mma(*operands: str):
    """A matplotlib Figure of the mma fragments, one panel per operand ("A", "B", "C").

    Each cell is coloured by the lane that holds it (hue: g = lane >> 2, shade:
    t = lane & 3) and labelled with that lane and its register (and half, for fp16).
    """
    if not operands:
        raise ValueError('operands: give at least one of "A", "B", "C"')
    maps = {op: fragment_map(op) for op in operands}  # checks the names
    margin = 1.5  # row numbers on the left of each panel
    fig, ax, fs = _figure(sum(SHAPES[op][1] + margin for op in operands), 16)
    x0 = 0.0
    for op in operands:
        lane_of, reg_of, half_of = owners(maps[op], SHAPES[op])  # each (16, cols)
        x0 += margin
        labels = _labels(lane_of, reg_of, half_of, op.lower(), HALVES[op])
        _grid(ax, lane_of, labels, x0, fs)
        for r in range(16):
            ax.text(x0 - 0.15, r + 0.5, str(r), ha="right", va="center", fontsize=fs)
        dims = {"A": "row x k", "B": "k x n", "C": "row x n, fp32"}[op]
        ax.text(x0, -1.2, f"{op} ({dims})", fontsize=fs * 1.5, va="bottom")
        x0 += SHAPES[op][1]
    return fig


def draw_load(name: str):
    """A matplotlib Figure of one of the kernels' ldmatrix.x4 loads ("Q", "K" or "V").

    The 16 x 16 tile as it lies in shared memory (offsets at 0). Left of each 8-wide
    row segment: the lane whose address is its start. Each cell: the lane and the
    register (and half) it lands in, coloured by lane as in ``draw_mma``.
    """
    load = kernel_load(name)
    src = ldmatrix_x4_load(load.address, load.trans)  # (32, 4, 2, 2)
    lane_of, reg_of, half_of = owners(src, (16, 16))  # each (16, 16)
    labels = _labels(lane_of, reg_of, half_of, load.registers[0][0], 2)  # "a" or "b"
    gap = 1.6  # room for the address labels left of each column block
    fig, ax, fs = _figure(2 * (8 + gap), 16)
    for block in range(2):  # two column blocks of 8, drawn apart
        x0 = gap + block * (8 + gap)
        sub = slice(8 * block, 8 * block + 8)
        _grid(ax, lane_of[:, sub], labels[:, sub], x0, fs, col0=8 * block)
    for lane in range(WARP_SIZE):
        row, col = load.address(lane)
        x0 = gap + (col // 8) * (8 + gap)
        ax.text(
            x0 - 0.15,
            row + 0.5,
            f"T{lane}\u2192",
            ha="right",
            va="center",
            fontsize=fs,
            fontweight="bold",
        )
    instr = "ldmatrix.x4.trans" if load.trans else "ldmatrix.x4"
    ax.text(0.1, -1.2, f"{load.role}: {instr}", fontsize=fs * 1.4, va="bottom")
    return fig
