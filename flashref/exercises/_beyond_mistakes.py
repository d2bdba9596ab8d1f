"""References and known mistakes for chapter 7's exercises, each written as a reader might.

- ``warp_tiles``: the causal warp-tiles of versions 14 and 17, from version 17's test
  (``v17_causal_skip.cu``: a warp skips key tile ``c0`` when
  ``c0 > q0 + wrow0 + rows - 1``, its last row before the tile), and its mistakes;
- ``lazy_update``: version 14's rule in NumPy (keep the reference maximum unless a block's
  maximum passes it by more than ``tau``), the reference of ``check_lazy_update``, with a
  switch for each mistake;
- ``l2_candidates``: ``io_model.gpu_traffic``'s L2 bytes with one thing changed.
"""

from __future__ import annotations

import math

import numpy as np

from .. import io_model as io
from ..state import SoftmaxState

# --- Exercise 7.1: the warp-tiles version 17 skips ----------------------------------------

PER_BLOCK = (
    "the test on the block's last row: no key tile lies wholly after a block's rows (the "
    "loop stops at the diagonal), so the skip is per warp, on the warp's own last row"
)
FIRST_ROW = "the test on the warp's first row: a warp skips only if its last row precedes c0"
ALL_KEY_TILES = "every key tile up to N: a causal launch stops at the block's last row"
TILES_NOT_WARPS = "total in tiles, not warp-tiles: each tile a block visits is `warps` warp-tiles"


def warp_tiles(N, Br, Bc, warps, *, test="last", k_end="causal") -> tuple[int, int]:
    """(skipped, total) warp-tiles of a causal launch with Nq = Nk = N (N a multiple of Br)."""
    rows = Br // warps  # query rows per warp
    skipped = total = 0
    for q0 in range(0, N, Br):
        end = min(N, q0 + Br) if k_end == "causal" else N
        for c0 in range(0, end, Bc):
            for w in range(warps):
                total += 1
                first, last = q0 + w * rows, q0 + w * rows + rows - 1
                skipped += {"last": c0 > last, "first": c0 > first, "block": c0 > q0 + Br - 1}[test]
    return skipped, total


def skip_candidates(N, Br, Bc, warps) -> list[tuple[str, tuple[int, int]]]:
    skipped, total = warp_tiles(N, Br, Bc, warps)
    return [
        (PER_BLOCK, warp_tiles(N, Br, Bc, warps, test="block")),
        (FIRST_ROW, warp_tiles(N, Br, Bc, warps, test="first")),
        (ALL_KEY_TILES, warp_tiles(N, Br, Bc, warps, k_end="all")),
        (TILES_NOT_WARPS, (skipped, total // warps)),
    ]


# --- Exercise 7.2: the lazy rescale ---------------------------------------------------------

EAGER = (
    "rescaled whenever the block's maximum grows: keep m unless the block's maximum passes "
    "it by more than tau"
)
ABSOLUTE = "the block's maximum compared with tau itself, not with m + tau"
NO_O_RESCALE = "l rescaled but not o: both carry the old maximum and take the same factor"
NO_RESCALE = "a new maximum without rescaling l and o: their old terms keep the old scale"
WRONG_WAY = "rescaled the wrong way: the factor is exp(m_old - m_new), at most 1"
TAU_CONVERTED = "tau converted again: it is given in natural-log units, use it as it is"


def lazy_update(state, s, v, tau, mistake=None) -> SoftmaxState:
    """Fold ``s (R, Bc)``, ``v (Bc, dv)`` into ``state`` by version 14's rule, or a mistake's."""
    m, l, o = state.m, state.l, state.o
    mx = s.max(axis=-1)  # (R,)
    if mistake == TAU_CONVERTED:
        tau = tau * math.log(2)
    grow = mx > tau if mistake == ABSOLUTE else mx - m > tau  # (R,) True where m = -inf
    if mistake == EAGER:
        grow = mx > m
    m_new = np.where(grow, np.maximum(m, mx), m)  # (R,)
    with np.errstate(all="ignore"):
        alpha = np.where(grow, np.exp((m_new - m) if mistake == WRONG_WAY else (m - m_new)), 1.0)
        P = np.exp(s - m_new[:, None])  # (R, Bc)
        if mistake == NO_RESCALE:
            alpha = np.ones_like(alpha)
        l_new = l * alpha + P.sum(axis=-1)
        o_alpha = 1.0 if mistake == NO_O_RESCALE else alpha[:, None]
        o_new = o * o_alpha + P @ v  # (R, dv)
    return SoftmaxState(m_new, l_new, o_new)


LAZY_MISTAKES = (EAGER, ABSOLUTE, NO_O_RESCALE, NO_RESCALE, WRONG_WAY, TAU_CONVERTED)

# --- Exercise 7.3: the L2 bytes of FlashAttention-2's order -------------------------------

FLOOR_TR = "floor division: a ragged last query tile reads K and V too, so Tr rounds up"
KV_ONCE = "K and V once: that is DRAM's share when they fit in L2; L2 serves every re-read"
NO_LSE = "no lse: each query tile writes its lse (float32) beside O_i"
LSE_FP16 = "lse in 2 bytes: the kernels write it in float32"
ONE_HEAD = "one head: the call has `heads` heads, each with its own Q, K, V and O"
NO_O = "no O: each query tile writes O_i once, through L2"


def l2_bytes(N, d, Br, heads) -> int:
    """The L2 bytes of ``io_model.gpu_traffic``, not causal, fp16."""
    return io.gpu_traffic(N, N, d, Br=Br, heads=heads, l2_bytes=1).l2.total_bytes


def l2_candidates(N, d, Br, heads) -> list[tuple[str, int]]:
    walk = io.closed_form_q_outer(N, N, d, Br=Br, Bc=1)
    one = walk.total_bytes
    kv = walk.reads["K"] + walk.reads["V"]
    floor_kv = (N // Br) * N * d * 2 * 2
    return [
        (FLOOR_TR, (one - kv + floor_kv) * heads),
        (KV_ONCE, (one - kv + 2 * N * d * 2) * heads),
        (NO_LSE, (one - walk.writes["lse"]) * heads),
        (LSE_FP16, (one - walk.writes["lse"] // 2) * heads),
        (ONE_HEAD, one),
        (NO_O, (one - walk.writes["O"]) * heads),
    ]
