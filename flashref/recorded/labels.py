"""Labels beside crowded points that keep their order and never overlap: for the rooflines.

``spread(values, gap)`` moves sorted positions as little as it can (least squares) so that
neighbours are at least ``gap`` apart, in the order given: the labels of points that lie
close together fan out around them instead of piling up above them.
``label_columns(ax, points, ...)`` places the labels of ``(x, y, text)`` points in columns
right of all the points, spread in ``log10(y)`` on a logarithmic axis, each joined to its
point by a thin line; in each column the labels keep their points' order, so no two lines
of a column cross. matplotlib is needed only by ``label_columns``.
"""

from __future__ import annotations

import math

import numpy as np


def spread(values, gap: float) -> np.ndarray:
    """Positions closest to ``values`` (in order, non-decreasing) with neighbours ``gap`` apart.

    The least-squares fit of ``values[i] - i gap`` by a non-decreasing sequence (pool
    adjacent violators), plus ``i gap`` back.
    """
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or (np.diff(v) < 0).any() or not np.isfinite(v).all():
        raise ValueError("values must be finite and sorted, non-decreasing")
    if not gap >= 0:
        raise ValueError(f"gap must be >= 0, got {gap!r}")
    shifted = v - gap * np.arange(v.size)
    blocks: list[list[float]] = []  # [mean, count]
    for x in shifted:
        blocks.append([x, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    fitted = np.concatenate([np.full(int(n), m) for m, n in blocks]) if blocks else shifted
    return fitted + gap * np.arange(v.size)


def label_columns(
    ax, points, columns: int = 2, gap: float = 0.11, x_at: float = 2.2, fontsize: float = 8
) -> list:
    """Label ``(x, y, text)`` points on a log-log ``ax`` in ``columns`` columns.

    Column c stands at ``x_at`` (c + 1) times the largest x; the points, in order of y, go
    to the columns in turn, and each column's labels are spread ``gap`` decades apart.
    Returns the text artists.
    """
    if not points:
        return []
    x_max = max(x for x, _, _ in points)
    ordered = sorted(points, key=lambda p: p[1])
    out = []
    for c in range(columns):
        mine = ordered[c::columns]
        ys = spread([math.log10(y) for _, y, _ in mine], gap)
        for (x, y, text), y_text in zip(mine, ys, strict=True):
            line = {"arrowstyle": "-", "color": "0.6", "lw": 0.5, "shrinkA": 0, "shrinkB": 2}
            out.append(
                ax.annotate(
                    text,
                    (x, y),
                    (x_max * x_at * (c + 1), 10**y_text),
                    fontsize=fontsize,
                    va="center",
                    arrowprops=line,
                )
            )
    return out
