"""Pictures of the decode kernel and of a serving step, drawn from the kernel's own rules.

``packed_rows(G, Nq, rows)``: which query head and query each of the ``rows`` rows of a
decode block's ``mma`` tile holds: the ``G`` query heads of one K/V head, ``Nq`` queries
each, packed as the decode kernels pack them (row ``R = (h - hkv G) Nq + i``), the rows past
``G Nq`` zeros. ``split_keys(L, S, Bc)``: the key range of each split, the kernels'
``t0 = split T / S`` over the ``T`` key tiles of ``Bc`` keys.
``draw_decode_kernel(G, Nq, B, Hkv, S)``: one split block (its 16 packed query rows against
one 64-key tile, each of the four consumer warps on 16 of the keys) above the grid
(batch x K/V head x split) and the merge of the splits' partial results.
``draw_serving_step()``: a decode step of ``flashref.transformer.generate.PagedGenerator`` as the
host and the device spend it (a schematic: the widths are not durations, as the figure
says).

matplotlib is imported inside the functions, as in ``flashref.hardware.hopper_figures``.
"""

from __future__ import annotations

__all__ = ["packed_rows", "split_keys", "draw_decode_kernel", "draw_serving_step"]

ROWS, BC, WARPS = 16, 64, 4  # rows of an mma tile, keys of a tile, consumer warps


def packed_rows(G: int, Nq: int = 1, rows: int = ROWS) -> list[tuple[int, int] | None]:
    """``[(head within the group, query) or None]`` for rows ``0 .. rows - 1`` of a block."""
    if G < 1 or Nq < 1 or rows < 1:
        raise ValueError(f"G, Nq and rows must be positive, got {G}, {Nq}, {rows}")
    return [divmod(R, Nq) if R < G * Nq else None for R in range(rows)]


def split_keys(L: int, S: int, Bc: int = BC) -> list[range]:
    """The keys of each of ``S`` splits of a sequence of ``L`` keys, cut at tile bounds."""
    if L < 0 or S < 1 or Bc < 1:
        raise ValueError(f"L must be >= 0, S and Bc positive, got {L}, {S}, {Bc}")
    T = -(-L // Bc)
    bounds = [s * T // S for s in range(S + 1)]
    return [range(min(bounds[s] * Bc, L), min(bounds[s + 1] * Bc, L)) for s in range(S)]


def _box(ax, x, y, w, h, colour, text="", fs=9, **kw):
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="0.3", lw=0.6, **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fs)


def draw_decode_kernel(
    G: int = 4, Nq: int = 1, B: int = 2, Hkv: int = 2, S: int = 3, L: int = 1000
):
    """Top: one split block, its ``ROWS`` packed rows of Q (one colour per query head, grey
    zeros past ``G Nq``) against a 64-key tile of K, S = Q K^T cut into the four consumer
    warps' 16 keys each. Bottom: the grid, a block per (sequence, K/V head, split) over
    ``L`` keys each, the splits' partial (O_s, lse_s) merged into each row of O."""
    import matplotlib.pyplot as plt
    from matplotlib import colormaps

    heads = colormaps["tab10"].colors
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8.6), height_ratios=[1, 1.15], dpi=100)
    for ax in (top, bottom):
        ax.axis("off")
    # -- one block: Q rows (16) x the tile's 64 keys
    rows = packed_rows(G, Nq)
    qx, sx, unit = 0.0, 5.2, 0.1  # the Q tile's and the S tile's left edges; one key's width
    for R, who in enumerate(rows):
        y = ROWS - 1 - R
        colour = heads[who[0]] if who else "0.88"
        label = f"head {who[0]}" + (f", q{who[1]}" if Nq > 1 else "") if who else "zeros"
        _box(top, qx, y, 3.2, 1, colour, f"row {R}: {label}", fs=7.5)
        for w in range(WARPS):
            _box(
                top,
                sx + w * 16 * unit,
                y,
                16 * unit,
                1,
                colour if who else "0.93",
                alpha=0.35 + 0.15 * w if who else 1.0,
            )
    for w in range(WARPS):
        top.text(
            sx + (w + 0.5) * 16 * unit,
            ROWS + 0.4,
            f"warp {w}\nkeys {16 * w}-{16 * w + 15}",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    top.text(
        qx + 1.6,
        ROWS + 0.4,
        f"Q: the {G} query heads\nof one K/V head",
        ha="center",
        va="bottom",
        fontsize=9,
    )
    top.text(4.2, ROWS / 2, "x K$^T$\n=", ha="center", va="center", fontsize=12)
    top.text(
        sx + 3.2,
        -1.2,
        f"S = Q K$^T$: {ROWS} rows x {BC} keys of one tile, one mma "
        "m16n8k16 row block;\nthe producer warp's TMA brings the tile, each warp "
        "computes its 16 keys,\nsoftmax and P V on its fragments, then the warps merge",
        ha="center",
        va="top",
        fontsize=9,
    )
    top.set_xlim(-0.2, 11.8)
    top.set_ylim(-4.4, ROWS + 2.4)
    top.set_title(
        f"One split block: G = {G} heads x Nq = {Nq} packed into the {ROWS} rows of an mma tile",
        fontsize=11,
    )
    # -- the grid and the merge
    keys = split_keys(L, S)
    bw, bh, gap = 1.9, 0.8, 0.25
    row_y = {}
    for b in range(B):
        for h in range(Hkv):
            y = (B * Hkv - 1 - (b * Hkv + h)) * (bh + gap)
            row_y[b, h] = y
            bottom.text(
                -0.15, y + bh / 2, f"seq {b}, K/V head {h}", ha="right", va="center", fontsize=8.5
            )
            for s in range(S):
                _box(
                    bottom,
                    s * (bw + 0.1),
                    y,
                    bw,
                    bh,
                    heads[s + 4],
                    f"split {s}\nkeys {keys[s].start}-{keys[s].stop - 1}",
                    fs=7.5,
                )
            mx = S * (bw + 0.1) + 1.3
            bottom.annotate(
                "",
                (mx, y + bh / 2),
                (S * (bw + 0.1) - 0.05, y + bh / 2),
                arrowprops={"arrowstyle": "-|>", "color": "0.35"},
            )
            _box(bottom, mx, y, 2.4, bh, "0.92", f"merge: O, lse of\n{G} heads x {Nq}", fs=7.5)
    top_y = B * Hkv * (bh + gap)
    bottom.text(
        S * (bw + 0.1) / 2,
        top_y + 0.1,
        f"grid: B x Hkv x S = {B} x {Hkv} x {S} = {B * Hkv * S} blocks",
        ha="center",
        va="bottom",
        fontsize=9,
    )
    bottom.text(
        S * (bw + 0.1) + 2.5,
        top_y + 0.1,
        "partials (O_s, lse_s) merged:\nthe combine kernel (chapter 2's merge)",
        ha="center",
        va="bottom",
        fontsize=8.5,
    )
    bottom.set_xlim(-2.4, S * (bw + 0.1) + 4.0)
    bottom.set_ylim(-0.4, top_y + 1.0)
    fig.tight_layout()
    return fig


def draw_serving_step():
    """Replayed steps of ``PagedGenerator``: on the host, ``prepare_step`` (bookkeeping) and
    one graph launch per token, running ahead; on the GPU, what the graph holds: ``advance``
    (the new tokens' slots, the lengths grown), per layer the projections, ``append`` and
    the paged attention, then the next token (argmax) written where the next replay reads
    it. A schematic: the widths are not durations, as the figure says."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=100)
    ax.axis("off")
    host_y, dev_y, h = 2.3, 0.4, 1.2
    x, launches = 0.0, []
    for t in ("t", "t+1"):
        _box(
            ax,
            x,
            host_y,
            2.3,
            h,
            "tab:olive",
            f"prepare_step\n(token {t}):\npages, lengths",
            fs=7.5,
            alpha=0.55,
        )
        _box(ax, x + 2.3, host_y, 1.3, h, "0.75", "replay()", fs=7.5)
        launches.append(x + 2.95)
        x += 3.8
    device = [
        ("advance", 1.3, "tab:purple"),
        ("layer 0:\nq, k, v", 1.2, "tab:blue"),
        ("append", 1.2, "tab:orange"),
        ("paged\nattention", 1.4, "tab:red"),
        ("MLP", 0.9, "tab:blue"),
        ("layers\n1 .. L-1", 1.5, "0.85"),
        ("argmax:\ntoken t+1", 1.5, "tab:green"),
    ]
    dx = launches[0] + 0.6
    start = [dx]
    for label, w, colour in device:
        _box(ax, dx, dev_y, w, h, colour, label, fs=7.5, alpha=0.55)
        dx += w
    start.append(dx)
    _box(ax, dx, dev_y, 1.6, h, "0.95", "step t+1\n...", fs=7.5)
    for launch, begin in zip(launches, start, strict=True):
        ax.annotate(
            "",
            (begin + 0.1, dev_y + h),
            (launch, host_y),
            arrowprops={"arrowstyle": "-|>", "color": "0.35"},
        )
    ax.text(-0.2, host_y + h / 2, "host", ha="right", va="center", fontsize=10)
    ax.text(-0.2, dev_y + h / 2, "GPU", ha="right", va="center", fontsize=10)
    ax.text(
        dx + 1.6,
        -0.15,
        "schematic: widths are not durations. No copy and no "
        "synchronisation\nbetween host and GPU inside the loop: the host runs ahead",
        ha="right",
        va="top",
        fontsize=8.5,
        style="italic",
    )
    ax.set_xlim(-1.0, dx + 1.7)
    ax.set_ylim(-1.1, host_y + h + 0.3)
    ax.set_title("A decode step replayed from a CUDA graph: host and GPU", fontsize=11)
    fig.tight_layout()
    return fig
