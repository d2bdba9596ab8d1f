"""The backward kernels' grid: which query tiles each thread block visits, who adds into dQ.

Every backward version (``flashref/kernels/backward/bwdNN_*.cu``) launches one thread block
per key tile ``j`` of ``Bc`` keys and per (batch, head): the grid is ``(Tc, B*H)``. Block
``j`` loads ``K_j`` and ``V_j`` once, keeps ``dK_j`` and ``dV_j`` in registers, and walks
the query tiles ``i`` from ``i_start`` to ``Tr - 1``, each bringing ``Q_i, dO_i, lse_i,
D_i``; with ``causal`` the tiles wholly before its first key ``c0 = j Bc`` are skipped,
``i_start = c0 // Br`` (the kernels' ``const int i_start = causal ? c0 / Br : 0;``). At
each tile it adds its share of ``dQ_i`` into the float32 ``dQacc`` in global memory, one
atomic addition per element; version 8 adds in ``slices`` = 2 shares of ``Bc / 2`` keys,
one per consumer warpgroup, and a share whose keys all follow the tile's last query adds
nothing (its ``if (causal && q0 + Br - 1 < kw0)``). A version with a second dQ pass
(version 2) makes no addition: its ``flash_bwd2_dq`` writes each ``dQ_i`` once.

``backward_grid`` is those rules for any ``Nq, Nk, Bc, Br``; ``BackwardTiles`` is what a
version fixes of them (``flashref.gpu.backward_versions.backward_tiles`` reads it from the
registry, and its ``version_grid`` is ``tiles_grid`` of that); ``draw_backward_grid`` draws
them (chapter 8). A padded last tile
counts as the kernels see it: ``Br`` rows and ``Bc`` keys, past ``Nq`` and ``Nk`` or not.

matplotlib is imported inside the drawing function, as in ``hopper_figures``.
"""

from __future__ import annotations

from typing import NamedTuple

from .._checks import check_block

__all__ = ["BackwardGrid", "BackwardTiles", "backward_grid", "tiles_grid", "draw_backward_grid"]


class BackwardTiles(NamedTuple):
    """What one backward version fixes of its grid."""

    number: int  # the version
    Bc: int  # keys per thread block
    Br: int  # query rows per visit
    slices: int  # shares in which a block adds its part of dQ_i (dq_adds_per_tile)
    atomic: bool  # dQ added into dQacc; False: written once by a second pass


class BackwardGrid(NamedTuple):
    Tr: int  # query tiles of Br rows
    Tc: int  # key tiles of Bc keys: thread blocks per (batch, head)
    walks: tuple[range, ...]  # walks[j]: the query tiles block j visits, in order
    adding: tuple[tuple[int, ...], ...]  # adding[j]: how many of its shares add, per visit
    adds: tuple[int, ...]  # adds[i]: float32 atomic additions into each element of dQ_i

    def pairs(self) -> list[tuple[int, int]]:
        """``(i, j)`` of every query tile ``i`` that block ``j`` visits, block by block."""
        return [(i, j) for j, walk in enumerate(self.walks) for i in walk]


def backward_grid(
    Nq: int, Nk: int, Bc: int, Br: int, causal: bool = False, slices: int = 1, atomic: bool = True
) -> BackwardGrid:
    """The walk of each block over the query tiles, and the additions into each ``dQ_i``.

    ``slices``: shares of ``Bc / slices`` keys in which a block adds its part of ``dQ_i``
    (version 8's consumer warpgroups); ``atomic=False``: dQ by a second pass, no additions.
    """
    Nq, Nk = check_block(Nq, "Nq", 1), check_block(Nk, "Nk", 1)
    Bc, Br = check_block(Bc, "Bc", 1), check_block(Br, "Br", 1)
    slices = check_block(slices, "slices", 1)
    if Bc % slices:
        raise ValueError(f"Bc = {Bc} must be a multiple of slices = {slices}")
    Tr, Tc, width = -(-Nq // Br), -(-Nk // Bc), Bc // slices
    walks, adding, adds = [], [], [0] * Tr
    for j in range(Tc):
        c0 = j * Bc  # the block's first key
        i_start = c0 // Br if causal else 0  # earlier query tiles see none of these keys
        walk = range(min(i_start, Tr), Tr)
        shares = []
        for i in walk:
            q_last = i * Br + Br - 1  # the tile's last query
            n = sum(not (causal and q_last < c0 + s * width) for s in range(slices))
            shares.append(n if atomic else 0)
            adds[i] += shares[-1]
        walks.append(walk)
        adding.append(tuple(shares))
    return BackwardGrid(Tr, Tc, tuple(walks), tuple(adding), tuple(adds))


def tiles_grid(tiles: BackwardTiles, Nq: int, Nk: int, causal: bool = False) -> BackwardGrid:
    """``backward_grid`` with one version's tiles and way of adding dQ."""
    return backward_grid(Nq, Nk, tiles.Bc, tiles.Br, causal, tiles.slices, tiles.atomic)


def draw_backward_grid(
    tiles: BackwardTiles,
    Nq: int = 512,
    Nk: int | None = None,
    causal: bool = True,
    block: int | None = None,
):
    """The tile plane of one backward version (``tiles``): a column per thread block (key
    tile j), a row per query tile i. Block ``block``'s walk is numbered; its K_j, V_j come in
    once (top), its dK_j, dV_j go out once (bottom), and each visit adds into dQ_i (right:
    the additions each element of dQ_i receives from all the blocks, ``adds``)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    Nk = Nq if Nk is None else Nk
    g = tiles_grid(tiles, Nq, Nk, causal)
    block = g.Tc // 3 if block is None else check_block(block, "block", 0, g.Tc - 1)
    slices, atomic = tiles.slices, tiles.atomic
    w = tiles.Bc / tiles.Br  # a key tile's width, in query-tile heights
    x0, xq, dq_w = 1.9, 1.9 + g.Tc * w + 0.45, 1.25  # the tile plane; the dQ column
    xl = xq + dq_w + 0.45  # the key
    top, bottom = -1.3, g.Tr + 1.3
    fig = plt.figure(figsize=(8.0, 0.3 * (bottom - top)), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, xl + 3.6)
    ax.set_ylim(bottom, top)
    ax.axis("off")
    light, dark, red = "#c6dbef", "#2171b5", "#cb181d"

    def box(x, y, wd, ht, colour, text="", fs=9, tc="black", **kw):
        kw = {"edgecolor": "white", "lw": 1, **kw}
        ax.add_patch(Rectangle((x, y), wd, ht, facecolor=colour, **kw))
        if text:
            ax.text(x + wd / 2, y + ht / 2, text, ha="center", va="center", fontsize=fs, color=tc)

    skipped = {"facecolor": "white", "edgecolor": "#bdbdbd", "hatch": "///", "lw": 0.5}
    for j in range(g.Tc):
        x, mine = x0 + j * w, j == block
        colour, tc = (dark, "white") if mine else (light, "black")
        box(x, -1.05, w, 0.85, colour, f"K{j} V{j}", 8.5, tc)
        box(
            x,
            g.Tr + 0.2,
            w,
            0.85,
            colour,
            f"dK{j} dV{j}" if w > 1 else f"dK{j}\ndV{j}",
            8 if w <= 1 else 8.5,
            tc,
        )
        visits = dict(zip(g.walks[j], g.adding[j], strict=True))
        for i in range(g.Tr):
            if i not in visits:
                ax.add_patch(Rectangle((x + 0.03, i + 0.03), w - 0.06, 0.94, **skipped))
                continue
            for s in range(slices):  # a share whose keys all follow the tile's: paler
                faded = atomic and s >= visits[i]
                box(x + s * w / slices, i, w / slices, 1, colour, alpha=0.3 if faded else 1)
            if mine:
                ax.text(
                    x + w / 2,
                    i + 0.5,
                    str(i - g.walks[j].start + 1),
                    ha="center",
                    va="center",
                    fontsize=10,
                    color="white",
                    fontweight="bold",
                )
    most = max(g.adds) or 1
    for i in range(g.Tr):  # dQ_i and the additions into each of its elements
        shade = 0.15 + 0.6 * g.adds[i] / most if atomic else 0.0
        colour = plt.get_cmap("Reds")(shade) if atomic else light
        box(
            xq,
            i,
            dq_w,
            1,
            colour,
            f"dQ{i} +{g.adds[i]}" if atomic else f"dQ{i}",
            9,
            "white" if shade > 0.55 else "black",
        )
        ax.text(x0 - 0.12, i + 0.5, f"Q{i} dO{i}", ha="right", va="center", fontsize=9)
    if atomic:
        for i in g.walks[block]:  # the block's shares of dQ
            ax.annotate(
                "",
                xy=(xq - 0.04, i + 0.5),
                xytext=(x0 + (block + 1) * w, i + 0.5),
                arrowprops={
                    "arrowstyle": "->",
                    "color": red,
                    "lw": 1.1,
                    "shrinkA": 0,
                    "shrinkB": 0,
                },
            )
    ax.text(x0 - 0.12, -0.62, "loaded once", ha="right", va="center", fontsize=9)
    ax.text(x0 - 0.12, g.Tr + 0.62, "written once", ha="right", va="center", fontsize=9)
    ax.text(
        xq + dq_w / 2,
        -0.62,
        "dQacc (fp32)" if atomic else "dQ",
        ha="center",
        va="center",
        fontsize=9,
    )
    mask = ", causal" if causal else ""
    ax.text(
        xl,
        -0.62,
        f"version {tiles.number}: Bc = {tiles.Bc}, Br = {tiles.Br}\nNq = {Nq}, Nk = {Nk}{mask}",
        va="center",
        fontsize=8.5,
        linespacing=1.1,
    )
    # the key, beside the dQ column
    key = [
        (dark, f"block {block}'s walk:\nQ_i, dO_i, lse_i, D_i in"),
        (light, "another block's visit"),
    ]
    if causal:
        key.append((None, "skipped: every query\nprecedes every key"))
    if atomic:
        key.append(("arrow", f"block {block} adds its\nshare of dQ_i"))
        key.append(("+n", "additions into each\nelement of dQ_i"))
    else:
        key.append(("pass", f"dQ_i: written once by\nflash_bwd{tiles.number}_dq"))
    for k, (what, text) in enumerate(key):
        y = 0.1 + k * (g.Tr - 0.2) / len(key)
        if what == "arrow":
            ax.annotate(
                "",
                xy=(xl + 0.7, y + 0.4),
                xytext=(xl, y + 0.4),
                arrowprops={"arrowstyle": "->", "color": red, "lw": 1.1},
            )
        elif what in ("+n", "pass"):
            ax.text(
                xl + 0.35,
                y + 0.4,
                "+n" if what == "+n" else "dQ",
                ha="center",
                va="center",
                fontsize=9,
                color=red,
            )
        elif what is None:
            ax.add_patch(Rectangle((xl, y), 0.7, 0.8, **skipped))
        else:
            box(xl, y, 0.7, 0.8, what)
        ax.text(xl + 0.85, y + 0.4, text, va="center", fontsize=8.5, linespacing=1.1)
    return fig
