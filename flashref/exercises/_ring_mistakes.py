"""Known-wrong answers to the ring exercises, computed to name a reader's mistake.

``held_candidates`` and ``zigzag_candidates`` return ``[(mistake name, positions)]``:
the positions a ring schedule or a zigzag shard would have under each mistake (a
ring turning the other way, a step off by one, chunk ``2W - r`` for ``2W - 1 - r``,
the striped layout...). ``step_candidates`` returns ``[(mistake name, O, lse,
rows)]`` for one device's step: the causal mask taken from local instead of global
positions, or off by one, or the wrong way round, an lse without its maximum, rows
that see no key left as NaN or averaged over every key. ``rows`` is None when the
mistake's lse must match on every row, or a boolean ``(n_q,)`` of the rows on which
it must (the others are anything finite and hugely negative). Everything here is
float64 and written literally, so a mistake's NaN is the NaN a reader's code gives.
"""

from __future__ import annotations

import numpy as np

# --- the schedule: which block a device holds at a step -------------------------------------

RING_DIRECTION = "the ring turning the wrong way: block (r + s) mod W, not (r - s) mod W"
OFF_BY_ONE_STEP = "off-by-one step: at step 0 each device holds its own block"
NO_MOVE = "the blocks never moving: device r holds block r at every step"
LAYOUT_IGNORED = "contiguous positions under zigzag: a block carries its layout's positions"

# --- the zigzag shard of one device ----------------------------------------------------------

ZIGZAG_2W = "zigzag chunk 2W - r instead of 2W - 1 - r (chunks are numbered 0 to 2W - 1)"
ZIGZAG_SAME_ORDER = "chunks r and W + r instead of r and 2W - 1 - r"
CONTIGUOUS = "the contiguous layout (block r of W) instead of zigzag"
STRIPED = "the striped layout (positions r, r + W, r + 2W, ...) instead of zigzag"
UNSORTED = "the right positions, not in increasing order"

# --- one device's step -----------------------------------------------------------------------

LOCAL_MASK = "causal mask by local positions (row and column numbers), not P_q and P_k"
STRICT_MASK = "causal mask off by one (P_k < P_q instead of P_k <= P_q)"
FLIPPED_MASK = "causal mask the wrong way round (P_k >= P_q)"
NO_MASK = "causal=True ignored: no mask"
NO_SCALE = "scores not scaled by 1/sqrt(d)"
LSE_NO_MAX = "lse without the maximum: log(l) instead of m + log(l)"
LSE_IS_M = "the maximum m returned as lse, instead of m + log(l)"
UNNORMALISED = "the unnormalised o returned instead of O = o / l"
EMPTY_NAN = "NaN for a row that sees no key: it must give O = 0 and lse = -inf"
FINITE_FILL = "masked scores filled with a finite number, not -inf: empty rows average V"
NO_SHIFT = "exp of the raw scores (no maximum subtracted), which overflows"


def held_candidates(shards, W, step, device, contiguous):
    """(name, positions) for every schedule mistake; ``shards`` are the layout's positions.

    ``contiguous`` holds the contiguous layout's positions, for the layout mistake.
    """
    out = [
        (RING_DIRECTION, shards[(device + step) % W]),
        (OFF_BY_ONE_STEP, shards[(device - step - 1) % W]),
        (OFF_BY_ONE_STEP, shards[(device - step + 1) % W]),
        (NO_MOVE, shards[device]),
    ]
    if contiguous is not None:
        out.append((LAYOUT_IGNORED, contiguous[(device - step) % W]))
    return out


def zigzag_candidates(N, W, r):
    """(name, positions) for every zigzag mistake, computed by chunk arithmetic."""
    c = N // (2 * W)  # chunk length

    def chunk(i):  # (c,) positions of chunk i, past the end if i >= 2W
        return np.arange(i * c, (i + 1) * c)

    n = N // W
    return [
        (ZIGZAG_2W, np.concatenate([chunk(r), chunk(2 * W - r)])),
        (ZIGZAG_SAME_ORDER, np.concatenate([chunk(r), chunk(W + r)])),
        (CONTIGUOUS, np.arange(r * n, (r + 1) * n)),
        (STRIPED, np.arange(r, N, W)),
        (UNSORTED, np.concatenate([chunk(2 * W - 1 - r), chunk(r)])),
    ]


def _attend(S, V):
    """Literal softmax attention over scores S (n_q, n_k), V (n_k, dv), -inf = masked.

    Returns O, lse and the unnormalised o, with NaN wherever a reader's unguarded code
    gets one (a row of only -inf: exp(-inf - (-inf))).
    """
    m = S.max(axis=1, initial=-np.inf)  # (n_q,)
    P = np.exp(S - m[:, None])  # (n_q, n_k)
    l = P.sum(axis=1)  # (n_q,)
    o = P @ V  # (n_q, dv)
    return o / l[:, None], m + np.log(l), o, m, l


def step_reference(Q, P_q, K, V, P_k, causal, mask="global", scaled=True):
    """O (n_q, dv), lse (n_q,) of one step, rows with no visible key O = 0, lse = -inf."""
    S = Q @ K.T / (np.sqrt(Q.shape[1]) if scaled else 1.0)  # (n_q, n_k)
    allowed = _allowed(P_q, P_k, causal, mask)
    S = np.where(allowed, S, -np.inf)
    seen = allowed.any(axis=1)  # (n_q,)
    S_safe = np.where(seen[:, None], S, 0.0)
    O, lse, *_ = _attend(S_safe, V)
    return np.where(seen[:, None], O, 0.0), np.where(seen, lse, -np.inf)


def _allowed(P_q, P_k, causal, mask):
    n_q, n_k = len(P_q), len(P_k)
    if not causal or mask == "none":
        return np.ones((n_q, n_k), dtype=bool)
    if mask == "local":
        return np.arange(n_k) <= np.arange(n_q)[:, None]
    if mask == "strict":
        return P_k < P_q[:, None]
    if mask == "flipped":
        return P_k >= P_q[:, None]
    return P_k <= P_q[:, None]  # "global": the right one


def step_candidates(Q, P_q, K, V, P_k, causal):
    """(name, O, lse, rows) for every step mistake (see the module docstring)."""
    out = []
    masks = [("local", LOCAL_MASK), ("strict", STRICT_MASK), ("flipped", FLIPPED_MASK)]
    if causal:
        masks.append(("none", NO_MASK))
        for mask, name in masks:
            out.append((name, *step_reference(Q, P_q, K, V, P_k, causal, mask), None))
    out.append((NO_SCALE, *step_reference(Q, P_q, K, V, P_k, causal, scaled=False), None))

    S = Q @ K.T / np.sqrt(Q.shape[1])  # (n_q, n_k)
    allowed = _allowed(P_q, P_k, causal, "global")
    seen = allowed.any(axis=1)  # (n_q,)
    O, lse = step_reference(Q, P_q, K, V, P_k, causal)
    masked = np.where(allowed, S, -np.inf)
    m = masked.max(axis=1, initial=-np.inf)
    safe_m = np.where(seen, m, 0.0)
    l = np.exp(np.where(seen[:, None], masked, 0.0) - safe_m[:, None]).sum(axis=1)
    out.append((LSE_NO_MAX, O, np.where(seen, np.log(l), -np.inf), None))
    out.append((LSE_IS_M, O, m, None))
    out.append((UNNORMALISED, O * np.where(seen, l, 0.0)[:, None], lse, None))
    if not seen.all():
        O_nan, lse_nan, *_ = _attend(masked, V)  # unguarded: NaN on the empty rows
        out.append((EMPTY_NAN, O_nan, lse_nan, None))
        out.append((EMPTY_NAN, O_nan, lse, None))  # guarded lse, 0/0 in O
        O_fill = np.where(seen[:, None], O, V.mean(axis=0))  # equal scores: the mean
        out.append((FINITE_FILL, O_fill, lse, seen))
    O_raw, lse_raw = _no_shift(masked, V)
    out.append((NO_SHIFT, O_raw, lse_raw, None))
    return out


def _no_shift(S, V):
    """exp of the raw scores: inf / inf = NaN where a score is above 709.78."""
    E = np.exp(S)  # (n_q, n_k)
    l = E.sum(axis=1)
    return (E @ V) / l[:, None], np.log(l)
