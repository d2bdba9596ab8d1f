"""Known-wrong tiled-attention algorithms, simulated to name a reader's mistake.

``simulate_tiled(q, k, v, Br, Bc, causal, **kwargs)`` runs a tiled loop over full
float64 score matrices (the checkers' inputs are small) with one planted mistake
switched on: an update rule (no rescaling, rescaling the wrong way, exponentiating
with the stale maximum, per-tile normalisation, dividing inside the loop, no
shift), scores without the ``1/sqrt(d)`` scale, off-by-one key tiles, a causal
loop that stops too early or too late (its bound taken from the query tile's
first row, say), or a causal mask aligned the wrong way. ``candidates(causal)``
lists every mistake with the arguments that plant it.
"""

from __future__ import annotations

import numpy as np

NO_RESCALE = "no rescaling of O and l when the maximum grows"
WRONG_WAY = "rescaling the wrong way"
OFF_BY_ONE = "off-by-one tile bounds"
BOTTOM_RIGHT = "wrong causal alignment (bottom-right instead of top-left)"
STRICT_CAUSAL = "causal mask off by one (j < i instead of j <= i)"
NO_CAUSAL = "causal=True ignored: no causal mask"
PER_TILE = "normalising each tile's output separately / averaging per-tile outputs"
DIVIDE_INSIDE = "dividing by l inside the loop"
NO_SHIFT = "exp of the raw scores (no maximum subtracted), which overflows or underflows"
STALE_MAX = "exponentiated with the stale maximum (m_old, not m_new)"
NO_SCALE = "scores not scaled by 1/sqrt(d)"
CAUSAL_FIRST_ROW = "causal loop bound from the tile's first row, not its last"


def _stream(S, V, tiles, rule):
    """Fold key tiles into running (m, l, o) for rows S (R, Nk), V (Nk, dv), under a rule.

    ``rule`` is "correct" or one of the mistakes below. Arithmetic is left literal
    (inf and NaN are allowed to appear) so that the output matches what a reader's
    code with the same mistake computes.
    """
    R, dv = S.shape[0], V.shape[-1]
    m = np.full(R, -np.inf)
    l = np.zeros(R)
    o = np.zeros((R, dv))
    outs, masses = [], []  # per-tile outputs and their masses, for the per-tile rules
    first = True
    for idx in tiles:
        s, v = S[:, idx], V[idx]  # (R, Bc), (Bc, dv)
        m_new = np.maximum(m, s.max(axis=-1, initial=-np.inf))
        shift = np.where(np.isneginf(m_new), 0.0, m_new)
        p = np.exp(s - shift[:, None])  # (R, Bc)
        alpha = np.exp(m - shift)
        if rule == "correct":
            l, o = l * alpha + p.sum(-1), o * alpha[:, None] + p @ v
        elif rule in ("stale_max", "stale_max_guarded"):  # P on the old maximum's scale
            stale = m if rule == "stale_max" else np.where(np.isneginf(m), shift, m)
            p = np.exp(s - stale[:, None])  # (R, Bc); exp(s + inf) on the first tile, unguarded
            l, o = l * alpha + p.sum(-1), o * alpha[:, None] + p @ v
        elif rule == "no_rescale":
            l, o = l + p.sum(-1), o + p @ v
        elif rule == "wrong_way":  # exp(m_new - m_old): inf times 0 on the first tile
            beta = np.exp(m_new - m)
            l, o = l * beta + p.sum(-1), o * beta[:, None] + p @ v
        elif rule == "wrong_way_from_first":  # the same, with the state started from tile 1
            beta = np.ones(R) if first else np.exp(m_new - m)
            l, o = l * beta + p.sum(-1), o * beta[:, None] + p @ v
        elif rule == "rescale_new_tile":  # the correction applied to the new tile instead
            l, o = l + alpha * p.sum(-1), o + alpha[:, None] * (p @ v)
        elif rule == "divide_inside":  # o kept normalised, without undoing the old division
            l = l * alpha + p.sum(-1)
            o = (o * alpha[:, None] + p @ v) / l[:, None]
        elif rule == "no_shift":
            e = np.exp(s)
            l, o = l + e.sum(-1), o + e @ v
        elif rule in ("average", "sum", "average_all", "sum_all"):  # tiles normalised alone
            tile_m = s.max(axis=-1, initial=-np.inf)
            p_t = np.exp(s - np.where(np.isneginf(tile_m), 0.0, tile_m)[:, None])  # (R, Bc)
            tile_l = p_t.sum(-1)
            outs.append((p_t @ v) / tile_l[:, None])
            masses.append(tile_l > 0)
        else:
            raise ValueError(f"unknown rule {rule!r}")
        m, first = m_new, False
    if rule in ("average_all", "sum_all"):  # a tile with every key masked gives 0/0 = NaN
        total = np.sum(outs, axis=0)
        return total if rule == "sum_all" else total / len(outs)
    if rule in ("average", "sum"):  # tiles with every key masked left out, row by row
        if not outs:
            return o
        seen = np.array(masses)  # (T, R): tile has an allowed key for this row
        stacked = np.where(seen[..., None], np.array(outs), 0.0)  # (T, R, dv)
        total = stacked.sum(0)
        return total if rule == "sum" else total / seen.sum(0)[:, None]
    if rule == "divide_inside":
        return o
    return o / l[:, None]


def _key_tiles(stop, Bc, variant, end=None):
    """Key index tiles ``0..stop`` in steps of Bc, with an optional off-by-one.

    ``end``: where the last tile is cut (``stop`` unless given): a loop whose range
    stops at ``stop`` but whose slices ``k[c : c + Bc]`` run on to ``end``.
    """
    end = stop if end is None else end
    if variant == "correct":
        return [np.arange(c, min(c + Bc, end)) for c in range(0, stop, Bc)]
    if variant == "drop_tail":  # range(stop // Bc): the ragged last tile is never visited
        return [np.arange(c, c + Bc) for c in range(0, stop - stop % Bc, Bc)]
    if variant == "drop_last":  # range(0, stop - Bc, Bc)
        return [np.arange(c, min(c + Bc, stop)) for c in range(0, stop - Bc, Bc)]
    if variant == "short":  # slice c : c + Bc - 1
        return [np.arange(c, min(c + Bc - 1, stop)) for c in range(0, stop, Bc)]
    if variant == "overlap":  # slice c : c + Bc + 1, the boundary key counted twice
        return [np.arange(c, min(c + Bc + 1, stop)) for c in range(0, stop, Bc)]
    raise ValueError(f"unknown tile variant {variant!r}")


def simulate_tiled(
    q,
    k,
    v,
    Br,
    Bc,
    causal,
    rule="correct",
    tiles="correct",
    mask="top_left",
    causal_stop="skip",
    scaled=True,
):
    """Output (Nq, dv) of a tiled loop with the given rule, tile variant and mask.

    Also returns a boolean (Nq,) of rows that may attend to no key under this mask:
    their output is undefined (zeros, NaN or anything), so they match anything.
    """
    Nq, Nk = q.shape[0], k.shape[0]
    S = q @ k.T / (np.sqrt(q.shape[-1]) if scaled else 1.0)  # (Nq, Nk)
    i, j = np.arange(Nq)[:, None], np.arange(Nk)
    allowed = np.ones((Nq, Nk), dtype=bool)
    if causal:
        allowed = {
            "top_left": j <= i,
            "bottom_right": j <= i + Nk - Nq,
            "strict": j < i,
            "none": True,
        }[mask] & allowed
    S = np.where(allowed, S, -np.inf)
    O = np.zeros((Nq, v.shape[-1]))
    for r0 in range(0, Nq, Br):
        r1 = min(r0 + Br, Nq)
        end = None
        if not causal or causal_stop == "all":
            stop = Nk
        elif causal_stop == "skip":
            stop = min(Nk, r1)
        elif causal_stop == "before_diagonal":  # the loop ends where the query tile starts
            stop = min(Nk, r0)
        elif causal_stop == "first_row":  # k_end = r0 + 1: keys after the first row dropped
            stop = min(Nk, r0 + 1)
        elif causal_stop == "first_row_full":  # range(0, r0 + 1, Bc), slices k[c : c + Bc]
            stop, end = min(Nk, r0 + 1), Nk
        else:  # "one_short": range(0, r1 - 1, Bc)
            stop = min(Nk, r1 - 1)
        O[r0:r1] = _stream(S[r0:r1], v, _key_tiles(stop, Bc, tiles, end), rule)
    return O, ~allowed.any(axis=1)


# Rules whose output is NaN on every row (exp(inf) on the first tile): named only when
# nothing else explains an answer that is NaN everywhere.
NAN_EVERYWHERE = ("wrong_way", "stale_max")


def candidates(causal):
    """(mistake name, keyword arguments of ``simulate_tiled``) for every known mistake."""
    out = [
        (NO_RESCALE, {"rule": "no_rescale"}),
        (WRONG_WAY, {"rule": "wrong_way_from_first"}),
        (WRONG_WAY, {"rule": "rescale_new_tile"}),
        (PER_TILE, {"rule": "average"}),
        (PER_TILE, {"rule": "sum"}),
        (DIVIDE_INSIDE, {"rule": "divide_inside"}),
        (NO_SHIFT, {"rule": "no_shift"}),
        (STALE_MAX, {"rule": "stale_max_guarded"}),
        (NO_SCALE, {"scaled": False}),
    ]
    stops = ("skip", "all") if causal else ("skip",)
    if causal:
        for rule in ("average_all", "sum_all"):
            out += [(PER_TILE, {"rule": rule, "causal_stop": s}) for s in stops]
    for variant in ("drop_tail", "drop_last", "short", "overlap"):
        out += [(OFF_BY_ONE, {"tiles": variant, "causal_stop": s}) for s in stops]
    if causal:
        out += [
            (OFF_BY_ONE, {"causal_stop": "before_diagonal"}),
            (OFF_BY_ONE, {"causal_stop": "one_short"}),
            (CAUSAL_FIRST_ROW, {"causal_stop": "first_row"}),
            (CAUSAL_FIRST_ROW, {"causal_stop": "first_row_full"}),
            (BOTTOM_RIGHT, {"mask": "bottom_right", "causal_stop": "all"}),
            (STRICT_CAUSAL, {"mask": "strict", "causal_stop": "all"}),
            (NO_CAUSAL, {"mask": "none", "causal_stop": "all"}),
        ]
    # Last, because they are NaN everywhere and so only recognisable by elimination.
    out += [
        (name, {"rule": rule})
        for name, rule in ((WRONG_WAY, "wrong_way"), (STALE_MAX, "stale_max"))
    ]
    return out
