"""Checkers for chapter 6, the IO argument counted: the reader's numbers against ``io_model``.

``check_crossing_memory(fn)`` runs ``fn(N, d, order)`` and wants the smallest on-chip memory
``M`` in bytes (a whole number of fp16 elements) at which the loop order ``order``
(``"kv_outer"``, Algorithm 1, or ``"q_outer"``, FlashAttention-2), with its tile sizes from
``M``, moves fewer bytes than standard attention for one head with ``Nq = Nk = N``
(``io_model.flash_traffic`` against ``io_model.standard_traffic``).

``check_q_outer_traffic(fn)`` runs ``fn(Nq, Nk, d, Br, Bc)`` and wants the pair ``(bytes,
key_tiles)`` for FlashAttention-2's loop order without a mask, fp16 matrices and a float32
lse: the bytes it moves between HBM and the chip (``io_model.walk_q_outer``), and how many
key tiles it loads (a ``K_j`` with its ``V_j`` counts as one).

``check_l2_fit(fn)`` runs ``fn(d, l2_bytes, heads)`` and wants the largest ``N`` for which the
K and V (fp16, ``d`` columns each) of ``heads`` heads fit in an L2 of ``l2_bytes`` together:
``heads = 1`` is ``io_model.gpu_traffic``'s ``kv_fits_l2``.

Answers are integers and compared exactly; a wrong one is checked against the mistakes of
``_traffic_mistakes`` (``tests/exercises/test_exercises_traffic.py`` plants each).
"""

from __future__ import annotations

from .. import io_model as io
from . import _traffic_mistakes as tm
from ._exact import check_exercise
from ._report import CheckResult
from ._run import checker

__all__ = ["check_crossing_memory", "check_q_outer_traffic", "check_l2_fit"]

# (N, d) of the crossing cases: the chapter's head, a shorter and a longer one
CROSSING = [(4096, 64), (1024, 64), (2048, 128), (1000, 32)]


@checker
def check_crossing_memory(fn) -> CheckResult:
    """Check ``fn(N, d, order) -> M``: the smallest M (bytes) at which ``order`` moves fewer
    bytes than standard attention (see the module docstring)."""
    cases = []
    for order in ("kv_outer", "q_outer"):
        points = [(N, d, order) for N, d in CROSSING]
        expected = [tm.first_fewer(*p) for p in points]
        cases.append(
            (
                f"order={order!r}, (N, d) = {', '.join(map(str, CROSSING))}",
                points,
                expected,
                1,
                "M in bytes",
                "fn",
                tm.crossing_candidates,
                None,
            )
        )
    return check_exercise("check_crossing_memory", fn, "fn(N, d, order) -> M", cases)


# (Nq, Nk, d, Br) and the key tile widths Bc tried with each
Q_OUTER = [
    ((2048, 2048, 64, 128), (16, 32, 64, 128, 256)),  # the exercise's sweep
    ((1000, 777, 64, 128), (16, 50, 128, 1000)),  # ragged tails, Bc past Nk
    ((300, 4096, 128, 64), (64, 100)),  # Nq < Nk
    ((1, 5, 8, 4), (1, 2, 7)),  # one query
]


@checker
def check_q_outer_traffic(fn) -> CheckResult:
    """Check ``fn(Nq, Nk, d, Br, Bc) -> (bytes, key_tiles)`` for FlashAttention-2's order
    (see the module docstring)."""
    cases = []
    for (Nq, Nk, d, Br), widths in Q_OUTER:
        points = [(Nq, Nk, d, Br, Bc) for Bc in widths]
        expected = [
            (io.walk_q_outer(*p[:3], Br=Br, Bc=p[4]).total_bytes, -(-Nq // Br) * -(-Nk // p[4]))
            for p in points
        ]
        cases.append(
            (
                f"Nq={Nq}, Nk={Nk}, d={d}, Br={Br}, Bc in {widths}",
                points,
                expected,
                2,
                "(bytes, key_tiles)",
                "fn",
                tm.q_outer_candidates,
                None,
            )
        )
    return check_exercise(
        "check_q_outer_traffic", fn, "fn(Nq, Nk, d, Br, Bc) -> (bytes, key_tiles)", cases
    )


def _largest_fitting(d: int, l2_bytes: int, heads: int) -> int:
    """The largest N whose ``heads`` heads' K and V fit in L2, searched with gpu_traffic."""

    def fits(N):  # heads x one head's K and V <= L2  <=>  one head's <= L2 // heads
        return io.gpu_traffic(N, N, d, Br=1, heads=1, l2_bytes=l2_bytes // heads).kv_fits_l2

    lo, hi = 0, 1  # fits(lo) (N = 0 holds nothing), not fits(hi)
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


L2_SIZES = {"40 MiB": 40 * 2**20, "60 MiB": 60 * 2**20, "50 MB": 50 * 10**6}


@checker
def check_l2_fit(fn) -> CheckResult:
    """Check ``fn(d, l2_bytes, heads) -> N``: the longest sequence whose K and V, for ``heads``
    heads at once, fit in L2 (see the module docstring)."""
    cases = []
    for heads in (1, 3):
        points = [(d, size, heads) for size in L2_SIZES.values() for d in (64, 96, 128)]
        expected = [_largest_fitting(*p) for p in points]
        cases.append(
            (
                f"heads={heads}, L2 of {', '.join(L2_SIZES)}, d = 64, 96, 128",
                points,
                expected,
                1,
                "N",
                "fn",
                tm.l2_candidates,
                None,
            )
        )
    return check_exercise("check_l2_fit", fn, "fn(d, l2_bytes, heads) -> N", cases)
