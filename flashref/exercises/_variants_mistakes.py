"""References and known mistakes for the exercises on attention variants, each written as a
reader might.

- ``window_tiles``: the tiles a causal sliding window visits and those it masks, counted
  tile by tile from the rows' key ranges, with a switch for each mistake;
- ``sink_grad``: the gradient of a head's sink logit, and its mistakes;
- ``softcap_grad``: the chain rule back through ``c tanh(s / c)``, and its mistakes.
"""

from __future__ import annotations

import numpy as np

# --- the tiles of a sliding window ------------------------------------------------------------

OFF_BY_ONE = (
    "a window one key too narrow or too wide: query i sees keys i - left .. i, left + 1 keys in all"
)
NO_WINDOW_SKIP = "every causal tile visited: the tiles wholly left of the window are skipped"
LAST_ROW_EDGE = (
    "a tile skipped on its last row's window edge: the first row of the tile reaches furthest "
    "back, so a tile is empty only when its last key is before the first row's edge"
)
CAUSAL_MASK_ONLY = (
    "only the tiles on the diagonal counted as masked: a tile the window's left edge crosses "
    "needs the mask too"
)


def window_tiles(N, Br, Bc, left, *, mistake=None) -> tuple[int, int]:
    """(visited, masked) tiles of causal attention with ``window=(left, 0)``, Nq = Nk = N."""
    if mistake == "narrow":
        left -= 1
    elif mistake == "wide":
        left += 1
    visited = masked = 0
    for r0 in range(0, N, Br):
        r1 = min(r0 + Br, N) - 1  # the tile's last row
        for c0 in range(0, r1 + 1, Bc):  # causal: no key tile after the last row
            c1 = min(c0 + Bc, N) - 1
            edge = r1 - left if mistake == "last row" else r0 - left  # the earliest key seen
            if mistake != "no skip" and c1 < edge:
                continue
            visited += 1
            diagonal = c1 > r0  # some key after some query
            crossed = c0 < r1 - left  # some key before the last row's first key
            masked += diagonal or (crossed and mistake != "causal only")
    return visited, masked


def window_candidates(N, Br, Bc, left) -> list[tuple[str, tuple[int, int]]]:
    return [
        (OFF_BY_ONE, window_tiles(N, Br, Bc, left, mistake="narrow")),
        (OFF_BY_ONE, window_tiles(N, Br, Bc, left, mistake="wide")),
        (NO_WINDOW_SKIP, window_tiles(N, Br, Bc, left, mistake="no skip")),
        (LAST_ROW_EDGE, window_tiles(N, Br, Bc, left, mistake="last row")),
        (CAUSAL_MASK_ONLY, window_tiles(N, Br, Bc, left, mistake="causal only")),
    ]


# --- the gradient of a sink -------------------------------------------------------------------

SINK_SIGN = "the sign: the sink's dP is 0, so dS = P_sink * (0 - D) = -P_sink * D"
SINK_NO_LSE = "exp(sink) in place of exp(sink - lse): P_sink is the sink's share of the row"
SINK_NO_D = "D left out: dS of the sink is P_sink times (dP - D), and its dP is 0"
SINK_MEAN = "a mean over the rows: the sink is one parameter that every row uses, so add"


def sink_grad(lse, D, sink, *, mistake=None) -> float:
    """d(loss)/d(sink) for one head: ``-sum(exp(sink - lse) * D)`` over its rows."""
    P = np.exp(sink - (0.0 if mistake == "no lse" else lse))
    terms = P if mistake == "no D" else P * D
    total = terms.mean() if mistake == "mean" else terms.sum()
    return float(total if mistake == "sign" else -total)


SINK_MISTAKES = {"sign": SINK_SIGN, "no lse": SINK_NO_LSE, "no D": SINK_NO_D, "mean": SINK_MEAN}

# --- the derivative of a softcap --------------------------------------------------------------

UNSQUARED = "1 - tanh(s / c): the derivative of tanh is 1 - tanh^2"
OVER_C = "divided by c: c tanh(s / c) has derivative c * (1/c) * (1 - tanh^2) = 1 - tanh^2"
AT_CAPPED = (
    "the derivative taken at the capped score: 1 - tanh(s / c)^2 needs the score before "
    "the cap, or (capped / c)^2 in place of tanh^2"
)
NO_CHAIN = "dS returned unchanged: the cap's derivative multiplies it (the chain rule)"


def softcap_grad(dS, S, c, *, mistake=None) -> np.ndarray:
    """``dS * (1 - tanh(S / c)^2)``: the gradient of the scores before the cap."""
    t = np.tanh(S / c)
    if mistake == "at capped":
        t = np.tanh(c * t / c)
    derivative = {"unsquared": 1 - t, "over c": (1 - t**2) / c, "no chain": np.ones_like(t)}
    return dS * derivative.get(mistake, 1 - t**2)


SOFTCAP_MISTAKES = {"unsquared": UNSQUARED, "over c": OVER_C, "at capped": AT_CAPPED}
SOFTCAP_MISTAKES["no chain"] = NO_CHAIN
