"""The mistakes the chapter 6 checkers know, each computed the way a reader might make it.

Every answer of chapter 6's exercises is an integer (a memory size in bytes, a byte count,
a count of tile loads, a sequence length), so a mistake is recognised by giving exactly the
reader's answer. The right answers are ``flashref.io_model``'s counts; the wrong ones are
the same counts with one thing changed.
"""

from __future__ import annotations

from .. import io_model as io

# --- Exercise 6.1: where a tiled loop first moves fewer bytes than standard attention -------

ELEMENTS = "M in elements, not bytes: an fp16 element is 2 bytes, so M = 2 x elements"
ESTIMATE = (
    "the estimate 3 d^2 elements, not the count: the statistics and the compulsory bytes "
    "move the crossing, so search with io.flash_traffic"
)
LAST_NOT_FEWER = (
    "the last M that still moves as many bytes or more, not the first that moves fewer "
    "(one fp16 element, 2 bytes, too small)"
)
ORDER_SWAPPED = "the other loop order's crossing: kv_outer is Algorithm 1, q_outer FlashAttention-2"
FLOAT32 = "4 bytes per element: the chapter counts fp16, itemsize=2"


def first_fewer(N: int, d: int, order: str, itemsize: int = 2) -> int | None:
    """The smallest M (bytes, a whole number of elements) at which ``order`` moves fewer bytes
    than standard attention, for one head with Nq = Nk = N; None if none up to M = 4 N d."""
    standard = io.standard_traffic(N, N, d, itemsize=itemsize).total_bytes
    blocks = io.paper_blocks if order == "kv_outer" else io.fa2_blocks
    # The traffic depends on M only through the tile sizes, which change where the element
    # count passes a multiple of 4 d: the smallest M of each tile size is tried, in order.
    for Bc in range(1, N + 1):
        M = itemsize * (4 * d * (Bc - 1) + 1) if Bc > 1 else itemsize * 4 * d
        blocks(M, d, itemsize)  # (the sizes this M gives, checked)
        traffic = io.flash_traffic(N, N, d, M, order=order, itemsize=itemsize)
        if traffic.total_bytes < standard:
            return M
    return None


def crossing_candidates(N: int, d: int, order: str) -> list[tuple[str, int]]:
    M = first_fewer(N, d, order)
    other = first_fewer(N, d, "q_outer" if order == "kv_outer" else "kv_outer")
    out = [(ELEMENTS, M // 2), (ESTIMATE, 6 * d * d), (LAST_NOT_FEWER, M - 2)]
    out += [(ORDER_SWAPPED, other)] if other is not None else []
    wide = first_fewer(N, d, order, itemsize=4)
    return out + ([(FLOAT32, wide)] if wide is not None else [])


# --- Exercise 6.2: FlashAttention-2's bytes and key-tile loads -----------------------------

KV_OUTER_BYTES = (
    "the bytes of Algorithm 1's order (keys outside), which do depend on Bc: in "
    "FlashAttention-2's order K and V are read once per query tile, whatever Bc is"
)
KV_ONCE = "K and V read once: with queries outside, every query tile reads them again"
LSE_FP16 = "lse written in 2 bytes: the statistics are float32, 4 bytes"
NO_LSE = "no lse: each query tile writes its lse (float32) beside O_i"
ONE_QUERY_TILE = "the key tiles of one query tile: each of the Tr query tiles loads all Tc"
FLOOR_TILES = "floor division: a ragged last tile is still a tile, so Tr and Tc round up"
K_AND_V_APART = "K_j and V_j counted as two loads: a key tile is K_j with its V_j, one load"


def q_outer_candidates(Nq, Nk, d, Br, Bc) -> list[tuple[str, tuple[int, int]]]:
    walk = io.walk_q_outer(Nq, Nk, d, Br=Br, Bc=Bc)
    right = walk.total_bytes
    Tr, Tc = -(-Nq // Br), -(-Nk // Bc)
    tiles = Tr * Tc
    lse = walk.writes["lse"]
    return [
        (KV_OUTER_BYTES, (io.walk_kv_outer(Nq, Nk, d, Br=Br, Bc=Bc).total_bytes, tiles)),
        (KV_ONCE, (right - walk.reads["K"] - walk.reads["V"] + 2 * Nk * d * 2, tiles)),
        (LSE_FP16, (right - lse // 2, tiles)),
        (NO_LSE, (right - lse, tiles)),
        (ONE_QUERY_TILE, (right, Tc)),
        (FLOOR_TILES, (right, (Nq // Br) * (Nk // Bc))),
        (K_AND_V_APART, (right, 2 * tiles)),
    ]


# --- Exercise 6.3: the longest sequence whose K and V fit in L2 ------------------------------

K_ONLY = "K alone: the re-reads are of K and V, 2 N d elements for one head"
FOUR_BYTES = "4 bytes per element: K and V are fp16, 2 bytes"
ONE_HEAD = "one head's K and V: here `heads` heads are in flight, and all of theirs must fit"
FIRST_OVER = "the first N that does not fit, not the last that does"


def l2_candidates(d: int, l2_bytes: int, heads: int) -> list[tuple[str, int]]:
    right = l2_bytes // heads // (4 * d)
    return [
        (K_ONLY, l2_bytes // heads // (2 * d)),
        (FOUR_BYTES, l2_bytes // heads // (8 * d)),
        (ONE_HEAD, l2_bytes // (4 * d)),
        (FIRST_OVER, right + 1),
    ]
