"""Pictures of Hopper's layouts and schedules, drawn from the models of ``flashref.gpu``.

``draw_swizzle()``: a 64-column 16-bit tile's 16-byte chunks, as the rows hold them
(left) and where the 128-byte swizzle stores them in shared memory (right).
``draw_accumulators(n, warp)``: which thread of the warpgroup holds each element of a
``wgmma`` m64nNk16 accumulator (left: one hue per warp, rows 16 w .. 16 w + 15, lighter as
the lane's group g = lane // 4 grows), and, enlarged, the thread and register of each
element in one warp's rows (right).
``draw_pingpong(n_tiles, n_mine, stages)``: version 21's and version 23's consumer
warpgroups as a timeline of their products and softmaxes, from ``flashref.hardware.pingpong``.
``draw_overlap()``: version 20's loop above version 21's, one consumer warpgroup and the tensor
cores (``overlap_timeline``: a schematic with made-up durations, labelled so on the figure).
``draw_ring(n_tiles, stages)``: the producer's copies, each stage's tile and both consumer
warpgroups in the pingpong model's order of events (``ring_boxes``).

matplotlib is imported inside the functions, as in ``flashref.hardware.fragment_figures``;
each returns a pyplot figure 8 inches wide at 100 dpi (800 pixels, the book's page).
"""

from __future__ import annotations

import numpy as np

from .._checks import check_block
from . import hopper as hp
from . import pingpong as pp
from .pingpong import Event

WIDTH_IN, DPI = 8.0, 100


def _figure(units_wide: float, units_high: float):
    import matplotlib.pyplot as plt

    cell = WIDTH_IN / units_wide
    fig = plt.figure(figsize=(WIDTH_IN, cell * units_high), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, units_wide)
    ax.set_ylim(units_high - 1.5, -1.5)  # row 0 on top, room for titles
    ax.axis("off")
    return fig, ax, min(8.0, 72 * cell * 0.3)


def _cell(ax, x, y, colour, text, fs, size=1.0):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), size, size, facecolor=colour, edgecolor="white", lw=0.5))
    if text:
        ax.text(
            x + size / 2, y + size / 2, text, ha="center", va="center", fontsize=fs, linespacing=1.1
        )


def draw_swizzle(rows: int = 8, swizzle: int = 128):
    """Chunk j of row r (left, "r.j") and the 16-byte slot the swizzle stores it in (right)."""
    from matplotlib import colormaps

    stored = hp.chunk_map(rows, swizzle)  # (rows, 8): slot of logical chunk j
    colours = colormaps["tab10"].colors
    gap, margin = 2.0, 1.2
    fig, ax, fs = _figure(margin + 8 + gap + 8 + 0.3, rows + 1.5)
    for r in range(rows):
        ax.text(margin - 0.15, r + 0.5, f"row {r}", ha="right", va="center", fontsize=fs)
        for j in range(8):
            _cell(ax, margin + j, r, colours[j], f"{r}.{j}", fs)
            _cell(ax, margin + 8 + gap + stored[r, j], r, colours[j], f"{r}.{j}", fs)
    for x0 in (margin, margin + 8 + gap):
        for j in range(8):
            ax.text(x0 + j + 0.5, -0.2, str(j), ha="center", va="bottom", fontsize=fs)
    name = f"{swizzle}-byte swizzle" if swizzle else "no swizzle"
    ax.text(margin, -0.9, "chunks of each 128-byte row", fontsize=fs * 1.3, va="bottom")
    ax.text(margin + 8 + gap, -0.9, f"shared memory, {name}", fontsize=fs * 1.3, va="bottom")
    return fig


def accumulator_owners(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """owner (64, n): the thread holding D[row][col]; reg (64, n): its register index."""
    src = hp.wgmma_c_map(n)  # (128, n / 2, 2)
    owner, reg = np.full((64, n), -1), np.full((64, n), -1)
    for (t, i), _ in np.ndenumerate(src[..., 0]):
        owner[src[t, i, 0], src[t, i, 1]], reg[src[t, i, 0], src[t, i, 1]] = t, i
    return owner, reg


def draw_accumulators(n: int = 64, warp: int = 0):
    """Two panels. Left: who holds each element of a wgmma m64nNk16 accumulator (its first
    64 columns), one hue per warp, lighter as the lane group g grows. Right: warp ``warp``'s
    16 rows in columns 0-7, each element labelled T{thread} d{register}; a line under it
    says, from the map, how the registers go on in the next columns."""
    import matplotlib.pyplot as plt
    from matplotlib import colormaps
    from matplotlib.patches import ConnectionPatch, Rectangle

    warp = check_block(warp, "warp", 0, 3)
    owner, reg = accumulator_owners(n)  # each (64, n)
    hues = np.array(colormaps["tab10"].colors)[:4]  # one per warp
    cols = min(n, 64)

    def colour(t):
        w, g = t // 32, (t % 32) // 4
        return hues[w] + (1 - hues[w]) * (0.25 + 0.08 * g)

    fig = plt.figure(figsize=(WIDTH_IN, 4.4), dpi=DPI)
    left = fig.add_axes((0.01, 0.05, 0.37, 0.80))
    left.imshow(
        [[colour(t) for t in row] for row in owner[:, :cols]],
        extent=(0, cols, 64, 0),
        interpolation="nearest",
        aspect="auto",
    )
    for c in range(8, cols, 8):  # the 8-column blocks of the mma.sync C layout
        left.plot([c, c], [0, 64], color="white", lw=0.8)
    for r in (16, 32, 48):
        left.plot([0, cols], [r, r], color="black", lw=1)
    for w in range(4):
        left.text(
            cols + 1.5,
            16 * w + 8,
            f"warp {w}\nrows {16 * w}-{16 * w + 15}",
            va="center",
            fontsize=9.5,
        )
    left.add_patch(Rectangle((0, 16 * warp), 8, 16, fill=False, edgecolor="black", lw=2))
    left.set_xlim(0, cols * 1.42)
    left.set_ylim(64, 0)
    left.axis("off")
    more = f" (of {n})" if n > cols else ""
    left.set_title(
        f"m64n{n}k16 accumulator: 64 rows,\ncolumns 0-{cols - 1}{more}", fontsize=10.5, loc="left"
    )

    right = fig.add_axes((0.45, 0.16, 0.545, 0.71))
    rows = range(16 * warp, 16 * warp + 16)
    for y, r in enumerate(rows):
        for c in range(8):
            t = owner[r, c]
            right.add_patch(Rectangle((c, y), 1, 1, facecolor=colour(t), edgecolor="white"))
            right.text(c + 0.5, y + 0.5, f"T{t} d{reg[r, c]}", ha="center", va="center", fontsize=9)
    right.plot([0, 8], [8, 8], color="black", lw=1.5)  # rows g above, rows g + 8 below
    for y in (0, 8):
        right.text(-0.1, y + 0.5, f"row {rows[y]}", ha="right", va="center", fontsize=9)
    right.text(-0.1, 15.5, f"row {rows[15]}", ha="right", va="center", fontsize=9)
    right.set_xlim(0, 8)
    right.set_ylim(16, 0)
    right.axis("off")
    right.set_title(
        f"warp {warp}: rows {rows[0]}-{rows[-1]}, columns 0-7", fontsize=10.5, loc="left"
    )
    # the next 8 columns: the same threads, each register index 4 higher (from the map)
    step = {int(reg[r, c + 8] - reg[r, c]) for r in rows for c in range(8)}
    same = all(owner[r, c + 8] == owner[r, c] for r in rows for c in range(8))
    if same and len(step) == 1:
        k = step.pop()
        right.text(
            0,
            16.6,
            f"columns 8-15: the same threads, registers d{k}-d{k + 3};\n"
            f"columns 8j to 8j + 7: d{k}j to d{k}j + 3",
            va="top",
            fontsize=9.5,
            linespacing=1.3,
        )
    for y in (16 * warp, 16 * warp + 16):  # join the box on the left to the panel
        fig.add_artist(
            ConnectionPatch(
                (8, y),
                (0, y - 16 * warp),
                "data",
                "data",
                axesA=left,
                axesB=right,
                color="0.4",
                lw=0.8,
            )
        )
    return fig


def schedule_boxes(events) -> list[tuple[int, int, str, tuple]]:
    """(column, warpgroup, kind, op) of each box of a ping-pong timeline, from ``run``'s events:
    kind "gemm" (a turn that issues products), "empty" (a turn that issues none) or "softmax".
    Columns number the model's steps that hold a box, in order; boxes in one step share one."""

    found = []
    for cw in (0, 1):
        mine = [e for e in events if e.who == cw]
        for e, nxt in zip(mine, [*mine[1:], Event(-1, cw, ("end",))], strict=True):
            if e.op[0] in ("gemm", "softmax"):
                found.append((e.step, cw, e.op[0], e.op))
            elif e.op[0] == "sync" and nxt.op[0] != "gemm":
                found.append((e.step, cw, "empty", e.op))
    column = {s: i for i, s in enumerate(sorted({b[0] for b in found}))}
    return sorted((column[s], cw, kind, op) for s, cw, kind, op in found)


BOX_COLOURS = {"gemm": "#1f77b4", "softmax": "#ff7f0e", "empty": "#d9d9d9"}


def _box_text(kind: str, op: tuple) -> str:
    if kind == "softmax":
        return f"softmax\n{op[1]}"
    if kind == "empty":
        return "empty\nturn"
    return "last\nP V" if op[1] is None else f"GEMMs\n{op[1]}"


def draw_pingpong(n_tiles: int = 3, n_mine: tuple[int, int] | None = None, stages: int = 2):
    """Both consumer warpgroups' turns as a timeline, from ``pingpong.run``'s order of events:
    version 21 (no turns, top) above version 23 (turns, bottom). A box "GEMMs j" is a turn
    that issues S_j = Q K_j^T and O += P_{j-1} V_{j-1}; "softmax j" the softmax of S_j."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    n_mine = (n_tiles, n_tiles) if n_mine is None else n_mine
    panels = [
        ("version 21: no turns, both warpgroups issue at once", pp.without_turns()),
        ("version 23: turns, one warpgroup issues at a time", pp.consumer),
    ]
    boxes = [schedule_boxes(pp.run(n_tiles, n_mine, stages, program=p)) for _, p in panels]
    cols = max(b[0] for bs in boxes for b in bs) + 1
    label_w = 1.6  # columns of room for the row names
    height = 4.6  # inches: two panels of two rows, the legend below
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH_IN, height), dpi=DPI)
    box_pt = 0.92 * 72 * WIDTH_IN / (cols + label_w)  # a box's width in points
    fs = min(9.0, box_pt / (8 * 0.6))  # "softmax" (7 characters of about 0.6 em) and a margin
    for ax, (title, _), bs in zip(axes, panels, boxes, strict=True):
        for col, cw, kind, op in bs:
            fill = {"facecolor": BOX_COLOURS[kind], "edgecolor": "black", "lw": 0.5}
            ax.add_patch(Rectangle((col + 0.04, cw + 0.06), 0.92, 0.88, **fill))
            colour = "white" if kind == "gemm" else "black"
            ax.text(
                col + 0.5,
                cw + 0.5,
                _box_text(kind, op),
                ha="center",
                va="center",
                fontsize=fs,
                color=colour,
                linespacing=1.0,
            )
        for cw in (0, 1):
            ax.text(-0.2, cw + 0.5, f"warpgroup {cw}", ha="right", va="center", fontsize=10)
        ax.set_title(title, fontsize=10.5, loc="left")
        ax.set_xlim(-label_w, cols)
        ax.set_ylim(2.05, -0.05)
        ax.axis("off")
    legend = {
        "gemm": r"GEMMs $j$: its turn, $S_j = Q K_j^T$ and $O$ += $P_{j-1} V_{j-1}$ issued"
        r" (last: $O$ += $P V$ alone)",
        "softmax": r"softmax $j$: the softmax of $S_j$",
        "empty": "empty turn: a tile past its rows (causal), handed on",
    }
    shown = {b[2] for bs in boxes for b in bs}
    handles = [
        Patch(facecolor=BOX_COLOURS[k], edgecolor="black", lw=0.5, label=text)
        for k, text in legend.items()
        if k in shown
    ]
    fig.legend(
        handles=handles,
        loc="lower left",
        fontsize=9,
        ncol=1,
        frameon=False,
        bbox_to_anchor=(0.0, 0.0),
    )
    fig.text(
        0.98, 0.02, "steps of the model: order of events, not time \u2192", ha="right", fontsize=10
    )
    fig.tight_layout(rect=(0, (0.1 + 0.24 * len(handles)) / height, 1, 1))
    return fig


# ------------------------------------------------------------ version 21's overlap (schematic)


def overlap_timeline(
    n_tiles: int = 4,
    t_qk: float = 1.0,
    t_pv: float = 1.0,
    t_softmax: float = 1.4,
    overlap: bool = True,
) -> list[tuple]:
    """(lane, start, end, label) boxes of one consumer warpgroup over ``n_tiles`` key tiles,
    in made-up time units (the durations are arguments, not measurements).

    Lanes: "tensor" (the warpgroup's products on the tensor cores, one at a time, in the order
    issued) and "warps" (its softmax). ``overlap=False`` is version 20's loop: S_j, wait, its
    softmax, P_j V_j, wait. ``overlap=True`` is version 21's: S_j and O += P_{j-1} V_{j-1}
    issued together, ``wait_group 1`` for S_j alone, the softmax of S_j while P_{j-1} V_{j-1}
    runs, then ``wait_group 0``.
    """
    n_tiles = check_block(n_tiles, "n_tiles", 1)
    for name, x in (("t_qk", t_qk), ("t_pv", t_pv), ("t_softmax", t_softmax)):
        if not (isinstance(x, int | float) and x > 0):
            raise ValueError(f"{name} must be a positive number, got {x!r}")
    boxes, now = [], 0.0
    if not overlap:
        for j in range(n_tiles):
            boxes.append(("tensor", now, now + t_qk, f"S{j}"))
            boxes.append(("warps", now + t_qk, now + t_qk + t_softmax, f"softmax {j}"))
            start = now + t_qk + t_softmax
            boxes.append(("tensor", start, start + t_pv, f"PV{j}"))
            now = start + t_pv
        return boxes
    boxes.append(("tensor", 0.0, t_qk, "S0"))  # tile 0: S_0 and its softmax alone
    boxes.append(("warps", t_qk, t_qk + t_softmax, "softmax 0"))
    now = t_qk + t_softmax
    for j in range(1, n_tiles):
        boxes.append(("tensor", now, now + t_qk, f"S{j}"))  # group 1
        boxes.append(("tensor", now + t_qk, now + t_qk + t_pv, f"PV{j - 1}"))  # group 2
        boxes.append(("warps", now + t_qk, now + t_qk + t_softmax, f"softmax {j}"))  # wait<1>
        now += t_qk + max(t_pv, t_softmax)  # wait<0>
    boxes.append(("tensor", now, now + t_pv, f"PV{n_tiles - 1}"))  # the last P V alone
    return boxes


def draw_overlap(n_tiles: int = 4, t_qk: float = 1.0, t_pv: float = 1.0, t_softmax: float = 1.4):
    """Version 20's loop above version 21's, from ``overlap_timeline``: a schematic (made-up
    durations, said on the figure), one consumer warpgroup and the tensor cores it feeds."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    panels = [
        ("version 20: each product waited for before the softmax goes on", False),
        ("version 21: P V of tile j - 1 runs while the softmax of tile j is computed", True),
    ]
    timelines = [overlap_timeline(n_tiles, t_qk, t_pv, t_softmax, o) for _, o in panels]
    end = max(b[2] for bs in timelines for b in bs)
    colours = {"S": "#1f77b4", "P": "#2ca02c", "s": "#ff7f0e"}
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH_IN, 3.6), dpi=DPI, sharex=True)
    for ax, (title, _), bs in zip(axes, panels, timelines, strict=True):
        for lane, t0, t1, label in bs:
            y = 0 if lane == "tensor" else 1
            ax.add_patch(
                Rectangle(
                    (t0, y + 0.1),
                    t1 - t0,
                    0.8,
                    facecolor=colours[label[0]],
                    edgecolor="black",
                    lw=0.5,
                )
            )
            text = label.replace("softmax ", "sm ") if t1 - t0 < 1.2 else label
            ax.text(
                (t0 + t1) / 2,
                y + 0.5,
                text,
                ha="center",
                va="center",
                fontsize=9,
                color="white" if label[0] in "SP" else "black",
            )
        ax.set_yticks([0.5, 1.5], ["tensor cores", "warps: softmax"], fontsize=9)
        ax.set_ylim(2, 0)
        ax.set_xlim(0, end * 1.01)
        ax.set_title(title, fontsize=10, loc="left")
        ax.tick_params(axis="x", labelsize=9)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[1].set_xlabel(
        f"schematic time: S and P V take {t_qk:g} and {t_pv:g} units, a softmax "
        f"{t_softmax:g} (not measured)",
        fontsize=9,
    )
    handles = [
        Patch(facecolor=colours["S"], label="$S_j = Q K_j^T$"),
        Patch(facecolor=colours["P"], label="$O$ += $P_j V_j$"),
        Patch(facecolor=colours["s"], label="softmax of $S_j$"),
    ]
    fig.legend(handles=handles, loc="upper right", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


# --------------------------------------------------------- the producer / consumer ring


def ring_boxes(n_tiles: int = 6, stages: int = 3, program=None) -> list[tuple]:
    """(row, first column, last column, label) of each box of the ring's timeline, from
    ``pingpong.run``'s events (version 21's consumers by default: ``without_turns()``).

    Rows: "producer" (the TMA copy of tile j issued), "stage s" (tile j held from its copy's
    issue to its release by the last warpgroup), "warpgroup 0/1" (its products, "S_j, PV_j-1",
    and its softmax). Columns number the model's steps that hold an event, in order."""

    program = pp.without_turns() if program is None else program
    events = pp.run(n_tiles, (n_tiles, n_tiles), stages, program=program)
    steps = sorted({e.step for e in events})
    col = {s: i for i, s in enumerate(steps)}
    boxes, loaded, released = [], {}, {}
    for e in events:
        c = col[e.step]
        if e.who == "producer":
            loaded[e.op[1]] = c
            boxes.append(("producer", c, c, f"copy {e.op[1]}"))
        elif e.op[0] == "gemm":
            j, k = e.op[1], e.op[2]
            parts = ([f"S{j}"] if j is not None else []) + ([f"PV{k}"] if k is not None else [])
            boxes.append((f"warpgroup {e.who}", c, c, " ".join(parts)))
        elif e.op[0] == "softmax":
            boxes.append((f"warpgroup {e.who}", c, c, f"softmax {e.op[1]}"))
        elif e.op[0] == "release":
            released[e.op[1]] = max(released.get(e.op[1], c), c)
    for j, c0 in loaded.items():
        boxes.append((f"stage {j % stages}", c0, released[j], f"K/V {j}"))
    merged = {}  # copies issued in one step: one box
    for b in boxes:
        if b[0] == "producer":
            merged.setdefault(b[1], []).append(b[3].split()[1])
    others = [b for b in boxes if b[0] != "producer"]
    copies = [
        ("producer", c, c, "copy " + (js[0] if len(js) == 1 else f"{js[0]}-{js[-1]}"))
        for c, js in merged.items()
    ]
    return copies + others


def draw_ring(n_tiles: int = 6, stages: int = 3):
    """The producer's copies, the ring's stages and both consumer warpgroups, from
    ``ring_boxes``: the order of events of the pingpong model, not a measured time."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    boxes = ring_boxes(n_tiles, stages)
    rows = ["producer", *(f"stage {s}" for s in range(stages)), "warpgroup 0", "warpgroup 1"]
    cols = max(b[2] for b in boxes) + 1
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.5 * len(rows) + 1.1), dpi=DPI)
    palette = plt.get_cmap("tab10").colors
    for row, c0, c1, label in boxes:
        y = rows.index(row)
        if row.startswith("stage"):
            colour = palette[int(label.split()[1]) % 10]
        else:
            colour = {"c": "#c7c7c7", "s": "#ff7f0e"}.get(label[0], "#1f77b4")
        ax.add_patch(
            Rectangle(
                (c0 + 0.04, y + 0.08),
                c1 - c0 + 0.92,
                0.84,
                facecolor=colour,
                edgecolor="black",
                lw=0.5,
                alpha=0.85,
            )
        )
        text = label.replace("softmax ", "sm\n").replace(" PV", "\nPV").replace("copy ", "copy\n")
        ax.text(
            (c0 + c1 + 1) / 2,
            y + 0.5,
            text,
            ha="center",
            va="center",
            fontsize=7.5,
            linespacing=1.0,
        )
    ax.set_yticks([y + 0.5 for y in range(len(rows))], rows, fontsize=9)
    ax.set_xticks([])
    ax.set_xlim(0, cols)
    ax.set_ylim(len(rows), 0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("steps of the model: the order of events, not time \u2192", fontsize=9)
    ax.set_title(
        f"{n_tiles} K/V tiles through a ring of {stages} stages (version 21's "
        "consumers; sm = softmax)",
        fontsize=10,
        loc="left",
    )
    fig.tight_layout()
    return fig
