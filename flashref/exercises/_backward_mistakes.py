"""Known-wrong backward passes, simulated to name a reader's mistake.

``simulate_tile(Qi, Kj, Vj, Oi, dOi, lse_i, **plant)`` computes one tile's ``(D, dS)``
and ``simulate_backward(q, k, v, o, lse, do, Br, Bc, causal, **plant)`` the whole tiled
backward ``(dq, dk, dv)`` (key/value tiles outside, query tiles inside), both in float64
with the scale ``1/sqrt(d)`` and with one planted mistake switched on: D from the wrong
arrays or from one tile, dS without D or without P, P recomputed without ``lse`` or
normalised within the tile, unscaled scores, dP from O, a missing or doubled scale in dQ
or dK, a transposed product, dQ or dK and dV overwritten instead of accumulated, a
ragged last tile dropped, and causal tiles skipped wrongly, not skipped, or masked the
wrong way. ``tile_candidates()`` and ``backward_candidates(causal)`` list every mistake
with the arguments that plant it. Arithmetic is left literal (inf and NaN may appear),
so that a simulated output matches what a reader's code with the same mistake returns;
a transpose that does not fit the case's shapes raises ValueError, as the reader's
would.
"""

from __future__ import annotations

import numpy as np

from ._attention_mistakes import BOTTOM_RIGHT, NO_CAUSAL, OFF_BY_ONE, STRICT_CAUSAL

D_WRONG_ARRAYS = "D from the wrong arrays: D = rowsum(dO * O), not O * O or dO * dO"
D_ONE_TILE = "D summed over one tile's keys only: D = rowsum(dO * O) covers every key"
NO_D = "D left out: dS = P * (dP - D), not P * dP"
NO_P = "P left out of dS: dS = P * (dP - D), not dP - D"
NO_LSE = "P recomputed without subtracting lse: P = exp(S - lse)"
TILE_SOFTMAX = "P normalised within the tile: P = exp(S - lse), with the whole row's lse"
NO_SCALE_S = "scores not scaled by 1/sqrt(d) when P is recomputed"
DP_FROM_O = "dP from O instead of dO: dP = dO V^T"
NO_SCALE_DQ = "dQ without the scale: dQ = scale * dS K"
NO_SCALE_DK = "dK without the scale: dK = scale * dS^T Q"
TWICE_SCALE_DK = "the scale applied twice in dK (once in the loaded Q, once more after)"
TRANSPOSE_DQ = "dS^T instead of dS in dQ: dQ = scale * dS K"
TRANSPOSE_DK = "dS instead of dS^T in dK: dK = scale * dS^T Q"
TRANSPOSE_DV = "P instead of P^T in dV: dV = P^T dO"
DQ_OVERWRITTEN = "dQ overwritten by each key tile instead of summed over the key tiles"
DKDV_OVERWRITTEN = "dK and dV overwritten by each query tile instead of summed over them"
NO_SKIP = (
    "fully masked causal tiles not skipped: they read keys that no query may attend to "
    "(NaN in this case), and 0 * NaN is NaN"
)
WRONG_SKIP = (
    "causal tiles skipped wrongly: a tile is fully masked only when its first key comes "
    "after its last query"
)


def _probabilities(S, lse, p_from):
    """P of one tile S (Br, Bc) under a rule: "lse" (right), "exp", "exp_plus", "tile"."""
    if p_from == "lse":
        return np.exp(S - lse[:, None])
    if p_from == "exp":
        return np.exp(S)
    if p_from == "exp_plus":  # lse added instead of subtracted
        return np.exp(S + lse[:, None])
    m = S.max(axis=1, initial=-np.inf)  # "tile": the tile's own softmax, 0 for empty rows
    e = np.exp(S - np.where(np.isneginf(m), 0.0, m)[:, None])
    total = e.sum(axis=1)
    return e / np.where(total > 0, total, 1.0)[:, None]


def simulate_tile(
    Qi,
    Kj,
    Vj,
    Oi,
    dOi,
    lse_i,
    allowed=None,
    *,
    p_from="lse",
    d_from="dO*O",
    ds="right",
    scaled=True,
    dp_from="dO",
):
    """``(D (Br,), P (Br, Bc), dS (Br, Bc))`` of one tile with a planted mistake.

    ``allowed`` (Br, Bc) or None marks the pairs that may attend. ``d_from``: "dO*O"
    (right), "O*O", "dO*dO", "tile" (rowsum(P * dP) over this tile) or "none" (D = 0).
    ``ds``: "right" or "no_p" (dP - D). ``dp_from``: "dO" or "O".
    """
    S = Qi @ Kj.T / (np.sqrt(Qi.shape[1]) if scaled else 1.0)  # (Br, Bc)
    if allowed is not None:
        S = np.where(allowed, S, -np.inf)
    P = _probabilities(S, lse_i, p_from)  # (Br, Bc)
    dP = (dOi if dp_from == "dO" else Oi) @ Vj.T  # (Br, Bc)
    D = {
        "dO*O": lambda: (dOi * Oi).sum(axis=1),
        "O*O": lambda: (Oi * Oi).sum(axis=1),
        "dO*dO": lambda: (dOi * dOi).sum(axis=1),
        "tile": lambda: (P * dP).sum(axis=1),
        "none": lambda: np.zeros(len(Qi)),
    }[d_from]()  # (Br,)
    dS = P * (dP - D[:, None]) if ds == "right" else dP - D[:, None]  # (Br, Bc)
    return D, P, dS


def _visited(visit, r0, r1, c0, c1) -> bool:
    """Does a causal loop with this rule visit the tile rows r0..r1-1, keys c0..c1-1?"""
    return {
        "skip": c0 <= r1 - 1,  # right: some key at or before the last query
        "all": True,
        "first_row": c0 <= r0,  # bound from the query tile's first row
        "last_key": c1 - 1 <= r1 - 1,  # bound from the key tile's last key
        "below": c1 - 1 <= r0,  # only tiles with nothing masked: the diagonal ones dropped
    }[visit]


def _allowed(mask, Nq, Nk, rows, cols):
    i, j = rows[:, None], cols[None, :]
    return {
        "top_left": j <= i,
        "bottom_right": j <= i + Nk - Nq,
        "strict": j < i,
        "none": np.ones((len(rows), len(cols)), dtype=bool),
    }[mask]


def _starts(N, B, drop_tail):
    return range(0, N - N % B, B) if drop_tail else range(0, N, B)


def simulate_backward(
    q,
    k,
    v,
    o,
    lse,
    do,
    Br,
    Bc,
    causal,
    *,
    tile=None,
    dq_scale=1,
    dk_scale=1,
    transpose=None,
    overwrite=None,
    visit="skip",
    mask="top_left",
    drop_tail=None,
):
    """``(dq, dk, dv)`` of a tiled backward with one planted mistake.

    ``tile``: keyword arguments of ``simulate_tile``. ``dq_scale``, ``dk_scale``: how many
    times the scale multiplies dQ and dK (0, 1 or 2). ``transpose``: "dq", "dk" or "dv".
    ``overwrite``: "dq" or "dkdv". ``visit`` and ``mask``: the causal loop's rule for
    skipping tiles and its mask. ``drop_tail``: "q" or "k", the ragged last tile missed.
    """
    Nq, Nk, d = q.shape[0], k.shape[0], q.shape[1]
    scale = 1 / np.sqrt(d)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for c0 in _starts(Nk, Bc, drop_tail == "k"):
        cols = np.arange(c0, min(c0 + Bc, Nk))
        Kj, Vj = k[cols], v[cols]  # (Bc, d), (Bc, dv)
        for r0 in _starts(Nq, Br, drop_tail == "q"):
            rows = np.arange(r0, min(r0 + Br, Nq))
            if causal and not _visited(visit, r0, rows[-1] + 1, c0, cols[-1] + 1):
                continue
            allowed = _allowed(mask, Nq, Nk, rows, cols) if causal else None
            Qi, dOi = q[rows], do[rows]  # (Br, d), (Br, dv)
            _, P, dS = simulate_tile(Qi, Kj, Vj, o[rows], dOi, lse[rows], allowed, **(tile or {}))
            parts = {
                "dq": scale**dq_scale * ((dS.T if transpose == "dq" else dS) @ Kj),  # (Br, d)
                "dk": scale**dk_scale * ((dS if transpose == "dk" else dS.T) @ Qi),  # (Bc, d)
                "dv": (P if transpose == "dv" else P.T) @ dOi,  # (Bc, dv)
            }
            for name, grad, index in (("dq", dq, rows), ("dk", dk, cols), ("dv", dv, cols)):
                if parts[name].shape != grad[index].shape:
                    raise ValueError(f"{name}: shapes {parts[name].shape} and {grad[index].shape}")
                if overwrite == name or (overwrite == "dkdv" and name != "dq"):
                    grad[index] = parts[name]
                else:
                    grad[index] += parts[name]
    return dq, dk, dv


def tile_candidates():
    """(mistake name, keyword arguments of ``simulate_tile``) for the one-tile exercise."""
    return [
        (D_WRONG_ARRAYS, {"d_from": "O*O"}),
        (D_WRONG_ARRAYS, {"d_from": "dO*dO"}),
        (D_ONE_TILE, {"d_from": "tile"}),
        (NO_D, {"d_from": "none"}),
        (NO_P, {"ds": "no_p"}),
        (NO_LSE, {"p_from": "exp"}),
        (NO_LSE, {"p_from": "exp_plus"}),
        (TILE_SOFTMAX, {"p_from": "tile"}),
        (NO_SCALE_S, {"scaled": False}),
        (DP_FROM_O, {"dp_from": "O"}),
    ]


def backward_candidates(causal):
    """(mistake name, keyword arguments of ``simulate_backward``) for the tiled exercise."""
    out = [(name, {"tile": kwargs}) for name, kwargs in tile_candidates()]
    out += [
        (NO_SCALE_DQ, {"dq_scale": 0}),
        (NO_SCALE_DK, {"dk_scale": 0}),
        (TWICE_SCALE_DK, {"dk_scale": 2}),
        (TRANSPOSE_DQ, {"transpose": "dq"}),
        (TRANSPOSE_DK, {"transpose": "dk"}),
        (TRANSPOSE_DV, {"transpose": "dv"}),
        (DQ_OVERWRITTEN, {"overwrite": "dq"}),
        (DKDV_OVERWRITTEN, {"overwrite": "dkdv"}),
        (OFF_BY_ONE, {"drop_tail": "q"}),
        (OFF_BY_ONE, {"drop_tail": "k"}),
    ]
    if causal:
        out += [
            (NO_SKIP, {"visit": "all"}),
            (WRONG_SKIP, {"visit": "first_row"}),
            (WRONG_SKIP, {"visit": "last_key"}),
            (WRONG_SKIP, {"visit": "below"}),
            (NO_CAUSAL, {"mask": "none"}),
            (NO_CAUSAL, {"mask": "none", "visit": "all"}),
            (BOTTOM_RIGHT, {"mask": "bottom_right"}),
            (BOTTOM_RIGHT, {"mask": "bottom_right", "visit": "all"}),
            (STRICT_CAUSAL, {"mask": "strict"}),
        ]
    return out
