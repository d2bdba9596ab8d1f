"""Pictures of chapter 5's kernels, each drawn from one of the models beside this module.

``draw_warp_split(d)``: which warp works on which rows of S and O in each step of a tile,
version 2 (three different splits) against version 3 (one), from ``warp_split``.
``draw_bank_map(name, d)``: the banks that one matrix of an ``ldmatrix.x4`` reads, with
version 3's unpadded rows and version 4's padded ones, from ``banks``.
``draw_cp_async_ring(n_tiles)``: versions 5 and 11's buffers over the key-tile loop, which
tile each one is being filled with or read for, and the barriers, from ``cp_async_ring``.

matplotlib is imported inside the functions, as in ``fragment_figures``; each returns a
pyplot figure 8 inches wide at 100 dpi (800 pixels, the book's page).
"""

from __future__ import annotations

import numpy as np

from . import banks as bk
from . import cp_async_ring as cr
from . import fragments as fr
from . import warp_split as ws
from .fragment_figures import lane_colours

WIDTH_IN, DPI = 8.0, 100
STEP = 1.5  # drawing units of one loop iteration of draw_cp_async_ring


def _warp_colours():
    from matplotlib import colormaps

    return np.array(colormaps["tab10"].colors)[[0, 1, 2, 3, 4, 5, 6, 9]]  # (8, 3)


def _row_runs(rows: list[int]) -> str:
    """[0, 1, 16, 17] -> "0-1, 16-17"."""
    runs, start = [], rows[0]
    for a, b in zip(rows, [*rows[1:], None], strict=True):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a > start else f"{a}")
            start = b
    return ", ".join(runs)


def draw_warp_split(d: int = 64):
    """Four panels: version 2's steps 1, 2 and 3, and version 3's one split for all three.

    Each element of S (64 x 64) or O (64 x d) is coloured by the warp that computes it;
    under each panel, the rows of warp 0.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    colours = _warp_colours()
    panels = [(2, 1, "S"), (2, 2, "S"), (2, 3, "O"), (3, 1, "S and O")]
    fig, axes = plt.subplots(1, 4, figsize=(WIDTH_IN, 2.9), dpi=DPI)
    for ax, (version, step, what) in zip(axes, panels, strict=True):
        owner = ws.owners(version, step, d)  # (64, 64) or (64, d)
        ax.imshow(
            owner,
            cmap=ListedColormap(colours),
            vmin=-0.5,
            vmax=7.5,
            interpolation="nearest",
            aspect="auto",
        )
        title = (
            f"v{version}, step {step}: {ws.STEPS[step]}"
            if version == 2
            else (f"v{version}: every step")
        )
        ax.set_title(title, fontsize=9)
        ax.set_xticks([0, owner.shape[1] - 1])
        ax.set_yticks([0, 16, 32, 48, 63])
        ax.tick_params(labelsize=8, length=2)
        ax.set_xlabel(f"{what} columns" if version == 2 else "S or O columns", fontsize=8)
        ax.text(
            0.5,
            -0.3,
            f"warp 0: {_row_runs(ws.rows_of(owner, 0))}",
            transform=ax.transAxes,
            ha="center",
            va="top",
            fontsize=8,
        )
    axes[0].set_ylabel("query row of the tile", fontsize=8)
    handles = [Patch(color=colours[w], label=f"warp {w}") for w in range(8)]
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=8,
        fontsize=8,
        frameon=False,
        handlelength=1.2,
        columnspacing=1.0,
    )
    fig.subplots_adjust(left=0.06, right=0.99, top=0.9, bottom=0.3, wspace=0.3)
    return fig


def bank_map_strides(d: int) -> dict[int, int]:
    """The row strides ``draw_bank_map`` draws: version 3's ``d``, version 4's padded
    ``d + 8`` (the registry's ``lds_of``; a test checks that they agree)."""
    return {3: d, 4: d + 8}


def draw_bank_map(name: str = "Q", d: int = 64, matrix: int = 0, strides=None):
    """Two panels, version 3 (rows of d halves) and version 4 (d + 8): the banks the 8 rows
    of matrix ``matrix`` of load ``name`` cover, one row per lane, and the passes it takes.
    ``strides`` ({3: lds, 4: lds}) defaults to ``bank_map_strides(d)``."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    load = fr.kernel_load(name)
    if matrix not in range(4):
        raise ValueError(f"matrix must be in 0..3, got {matrix!r}")
    lanes = range(8 * matrix, 8 * matrix + 8)
    colours = lane_colours()
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 2.3), dpi=DPI)
    strides = bank_map_strides(d) if strides is None else strides
    for ax, version in zip(axes, (3, 4), strict=True):
        lds = strides[version]
        banks = bk.row_banks(load.address, lds)  # (32, 4)
        start = bk.row_bytes(load.address, lds)  # (32,)
        n = int(bk.passes(load.address, lds)[matrix])
        for y, lane in enumerate(lanes):
            for w, bank in enumerate(banks[lane]):
                ax.add_patch(
                    Rectangle((bank, y), 1, 1, facecolor=colours[lane], edgecolor="white", lw=0.5)
                )
                if w == 0:
                    ax.text(bank + 2, y + 0.5, f"T{lane}", ha="center", va="center", fontsize=7)
            ax.text(32.4, y + 0.5, f"byte {start[lane]}", va="center", fontsize=7)
        ax.set(xlim=(0, 38), ylim=(8, 0))
        ax.set_xticks(range(0, 32, 4))
        ax.set_yticks([y + 0.5 for y in range(8)], [str(r) for r in range(8)])
        ax.tick_params(labelsize=8, length=2)
        ax.grid(axis="x", color="0.85", lw=0.5)
        ax.set_axisbelow(True)
        ax.set_xlabel("bank", fontsize=8, loc="left")
        pad = "no padding" if lds == d else "+8 halves"
        pas = "pass" if n == 1 else "passes"
        ax.set_title(
            f"v{version}: rows of {lds} halves ({2 * lds} bytes, {pad}): {n} {pas}", fontsize=9
        )
    axes[0].set_ylabel(f"row of matrix {matrix}", fontsize=8)
    fig.subplots_adjust(left=0.06, right=0.99, top=0.86, bottom=0.2, wspace=0.12)
    return fig


def ring_boxes(events: list[cr.Event]) -> tuple[list[tuple], list[tuple]]:
    """Boxes (buffer, x0, x1, kind, tile) and lines (x, kind) of a schedule, in drawing units.

    Iteration t takes the units t to t + 1.5 (the code before the loop ends at 0): its
    compute 1 unit, its other events an equal share of the rest, in program order. A copy's
    box runs from its issue to the start of its tile's compute (it may land any time before
    the wait); a compute's box is its slot.
    """
    per_step: dict[int, int] = {}
    for e in events:
        per_step[e.step] = per_step.get(e.step, 0) + (e.what != "compute")
    x = {s: STEP * s for s in per_step}  # the next free x of each iteration
    place = []
    for e in events:
        width = 1.0 if e.what == "compute" else (STEP - 1.0) / max(per_step[e.step], 1)
        if e.step < 0:  # before the loop: a slot each, ending at 0
            width = (STEP - 1.0) / per_step[e.step]
        place.append((x[e.step], x[e.step] + width))
        x[e.step] += width
    starts = {e.tile: x0 for e, (x0, _) in zip(events, place, strict=True) if e.what == "compute"}
    boxes, lines = [], []
    for e, (x0, x1) in zip(events, place, strict=True):
        if e.what == "issue":
            boxes.append((e.buffer, x0, starts[e.tile], "copy", e.tile))
        elif e.what == "compute":
            boxes.append((e.buffer, x0, x1, "compute", e.tile))
        else:
            lines.append(((x0 + x1) / 2, e.what))
    return boxes, lines


def draw_cp_async_ring(n_tiles: int = 5):
    """Version 5's two buffers above version 11's three, over ``n_tiles`` key tiles."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    light, dark = "#cfe2f3", "#e69138"
    fig, axes = plt.subplots(
        2, 1, figsize=(WIDTH_IN, 3.2), dpi=DPI, gridspec_kw={"height_ratios": [2, 3]}
    )
    for ax, (version, stages) in zip(axes, ((5, 2), (11, 3)), strict=True):
        events = cr.schedule(stages, n_tiles)
        boxes, lines = ring_boxes(events)
        for buffer, x0, x1, kind, tile in boxes:
            colour = dark if kind == "compute" else light
            ax.add_patch(
                Rectangle(
                    (x0, buffer + 0.1), x1 - x0, 0.8, facecolor=colour, edgecolor="0.3", lw=0.5
                )
            )
            text = f"read {tile}" if kind == "compute" else f"copy {tile}"
            ax.text((x0 + x1) / 2, buffer + 0.5, text, ha="center", va="center", fontsize=8)
        for x, kind in lines:
            style = (
                {"color": "black", "lw": 1.2}
                if kind == "barrier"
                else {"color": "0.5", "lw": 0.8, "ls": ":"}
            )
            ax.plot([x, x], [0, stages], **style)
        ax.set(xlim=(-STEP, STEP * n_tiles), ylim=(stages, 0))
        ax.set_yticks([b + 0.5 for b in range(stages)], [f"buffer {b}" for b in range(stages)])
        ax.set_xticks(
            [STEP * t + STEP / 2 for t in range(-1, n_tiles)],
            ["before the loop", *(f"iteration {t}" for t in range(n_tiles))],
        )
        ax.tick_params(labelsize=8, length=0)
        per = cr.barriers_per_tile(events)
        ax.set_title(
            f"v{version}: {stages} buffers of K and V, {per} __syncthreads per tile",
            fontsize=9,
            loc="left",
        )
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
    handles = [
        Patch(facecolor=light, edgecolor="0.3", label="copy in flight (cp.async)"),
        Patch(facecolor=dark, edgecolor="0.3", label="tile read by the warps' mma"),
        Line2D([], [], color="black", lw=1.2, label="__syncthreads"),
        Line2D([], [], color="0.5", lw=0.8, ls=":", label="cp.async.wait_group 1"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.1, right=0.99, top=0.92, bottom=0.17, hspace=0.5)
    return fig
