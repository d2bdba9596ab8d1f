"""Checkers for chapter 7, faster than FlashAttention-2: the skip, the lazy rescale, L2 bytes.

``check_warp_tiles(fn)`` runs ``fn(N, Br, Bc, warps)`` and wants the pair ``(skipped,
total)`` for a causal launch with ``Nq = Nk = N`` (a multiple of ``Br``): ``total`` the
warp-tiles (one warp, one key tile) version 14 computes, every warp of a block on every key
tile its block visits, and ``skipped`` those version 17 skips by its test, a warp whose
``Br / warps`` rows all come before the tile's first key.

``check_lazy_update(fn)`` runs ``fn(state, s, v, tau)`` with a ``SoftmaxState(m, l, o)`` of
``R`` rows, scores ``s (R, Bc)`` and values ``v (Bc, dv)`` in float64, and wants the new
``SoftmaxState(m, l, o)`` by version 14's rule: a row keeps its reference maximum ``m``
unless the block's maximum exceeds it by more than ``tau`` (natural-log units); where it
does, ``m`` becomes the block's maximum and ``l`` and ``o`` are rescaled by
``exp(m_old - m_new)``; then the block's weights ``exp(s - m)`` are added. ``m`` is compared
to 1e-10 relative (it is a copy of a score, or the old ``m``), ``l`` and ``o`` to
``softmax.RTOL`` relative to ``l`` and to ``l x max|v|``.

``check_l2_walk(fn)`` runs ``fn(N, d, Br, heads)`` and wants the bytes the SMs ask of L2
for a FlashAttention-2-order kernel with query tiles of ``Br`` rows, not causal, over
``heads`` heads of ``Nq = Nk = N``: fp16 matrices, a float32 lse, K and V read once per
query tile (``io_model.gpu_traffic(...).l2``).

The integer answers are compared exactly; every wrong answer is checked against the mistakes
of ``_beyond_mistakes`` (``tests/exercises/test_exercises_beyond.py`` plants each).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..state import SoftmaxState
from . import _beyond_mistakes as bm
from ._answer import excess, state_answer
from ._exact import check_exercise
from ._report import CheckResult
from ._run import Case, check_callable, checker, run
from .ring import name_mistakes
from .softmax import RTOL, where_worst

__all__ = ["check_warp_tiles", "check_lazy_update", "check_l2_walk"]

# --- Exercise 7.1 ----------------------------------------------------------------------------

# (Br, Bc, warps): version 17 at d = 128 and d = 64, and two other shapes
WARP_SHAPES = [(128, 64, 4), (128, 128, 4), (128, 32, 4), (64, 16, 2)]


@checker
def check_warp_tiles(fn) -> CheckResult:
    """Check ``fn(N, Br, Bc, warps) -> (skipped, total)``: version 17's skipped warp-tiles
    and version 14's warp-tiles, causal (see the module docstring)."""
    cases = []
    for Br, Bc, warps in WARP_SHAPES:
        points = [(N, Br, Bc, warps) for N in (Br, 4 * Br, 1024, 4096)]
        expected = [bm.warp_tiles(*p) for p in points]
        cases.append(
            (
                f"Br={Br}, Bc={Bc}, warps={warps}, N = {Br}, {4 * Br}, 1024, 4096",
                points,
                expected,
                2,
                "(skipped, total)",
                "fn",
                bm.skip_candidates,
                None,
            )
        )
    return check_exercise("check_warp_tiles", fn, "fn(N, Br, Bc, warps) -> (skipped, total)", cases)


# --- Exercise 7.2 ----------------------------------------------------------------------------

M_RTOL = 1e-10


def _lazy_case(label, state, s, v, tau) -> Case:
    ref = bm.lazy_update(state, s, v, tau)
    R, dv = ref.o.shape
    size = {"m": np.abs(ref.m), "l": ref.l, "o": ref.l[:, None] * np.abs(v).max()}
    tols = {"m": M_RTOL * np.maximum(size["m"], 1.0), "l": RTOL * size["l"], "o": RTOL * size["o"]}
    parts = ("m", "l", "o")

    def distances(value, scale=1.0, nan_matches=False):
        return [
            float(excess(getattr(ref, n), g, tols[n] * scale, nan_matches).max(initial=0.0))
            for n, g in zip(parts, value, strict=True)
        ]

    def describe(value):
        i = next(i for i, d in enumerate(distances(value)) if d > 1)
        name = parts[i]
        return f"{name}, {where_worst(getattr(ref, name), value[i], tols[name], what='row')}"

    def wrong():  # (name, its (m, l, o)) for every mistake
        return [(n, bm.lazy_update(state, s, v, tau, mistake=n)) for n in bm.LAZY_MISTAKES]

    return Case(
        f"{label}: s {s.shape}, tau={tau:.4g}",
        (state, s, v, tau),
        (ref.m, ref.l, ref.o),
        accept=lambda got: state_answer(got, {"m": (R,), "l": (R,), "o": (R, dv)}),
        distance=lambda value: max(distances(value)),
        describe=describe,
        within_float32=lambda value: False,  # float64 answers only (state_answer)
        wrong=(wrong, distances),
    )


def _lazy_mistakes(case, value) -> list[str]:
    """The mistakes whose state equals the reader's (NaN matching NaN) and is wrong here."""
    simulate, distances = case.wrong
    names = []
    for name, st in simulate():
        candidate = (st.m, st.l, st.o)
        if max(distances(candidate)) > 1 and max(distances(value, 1.0, True)) > 1:
            if all(
                (excess(c, g, 1e-9 * np.maximum(np.abs(c), 1.0), True) <= 1).all()
                for c, g in zip(candidate, value, strict=True)
            ):
                names.append(name)
    return names


def _lazy_cases():
    """(label, state, s, v, tau): each row's block maximum below, within and past tau."""
    rng = np.random.default_rng(14)
    tau = 8 * np.log(2)  # version 14's margin
    R, Bc, dv = 6, 16, 5

    def state_at(m):  # a state whose reference maximum is m (R,), after some blocks
        l = np.where(np.isfinite(m), 1.0 + 20 * rng.random(R), 0.0)
        o = np.where(np.isfinite(m)[:, None], rng.standard_normal((R, dv)) * l[:, None], 0.0)
        return SoftmaxState(m, l, o)

    def block(top):  # scores (R, Bc) whose row maxima are top (R,)
        s = top[:, None] - 4 * rng.random((R, Bc))
        s[np.arange(R), rng.integers(0, Bc, R)] = top
        return s

    v = rng.standard_normal((Bc, dv))
    m = np.array([10.0, 10.0, 10.0, 10.0, 10.0, 10.0])
    # the block's maximum passes m by: less than 0, within tau (past tau ln 2 too), past tau
    past = np.array([-3.0, 0.5, 4.5, 5.0, 6.0, 12.0])
    cases = [
        ("a first block, into an empty state", state_at(np.full(R, -np.inf)), block(m), v, tau),
        ("blocks below, within and past tau", state_at(m), block(m + past), v, tau),
        ("the same block with tau = 0 (the eager rule)", state_at(m), block(m + past), v, 0.0),
        ("every row past tau", state_at(m - 2), block(m + 7), v, tau),
        ("every row within tau", state_at(m), block(m + 3), v, tau),
    ]
    low = m - 30  # scores below 0: a test of the block's maximum against tau alone differs
    cases.append(("negative scores", state_at(low), block(low + past), v, tau))
    big = np.array([990.0, 995.0, 1000.0, 1003.0, 1010.0, 985.0])  # scores near 1000
    cases.append(("scores near 1000", state_at(big), block(big + past), v, tau))
    return cases


@checker
def check_lazy_update(fn) -> CheckResult:
    """Check ``fn(state, s, v, tau) -> SoftmaxState(m, l, o)``: version 14's lazy rescale
    (see the module docstring)."""
    check_callable(fn, "fn(state, s, v, tau) -> SoftmaxState")
    cases = [_lazy_case(*c) for c in _lazy_cases()]
    return run("check_lazy_update", fn, cases, partial(name_mistakes, matches=_lazy_mistakes))


# --- Exercise 7.3 ----------------------------------------------------------------------------

# (N, d, heads) and the query tile heights Br tried with each; (4096, 128, 128) is the
# profiled shape of versions 14 and 18
L2_WALK = [((4096, 128, 128), (128, 256)), ((1000, 64, 3), (64, 128)), ((16384, 64, 16), (128,))]


@checker
def check_l2_walk(fn) -> CheckResult:
    """Check ``fn(N, d, Br, heads) -> bytes``: what the SMs ask of L2 for FlashAttention-2's
    order (see the module docstring)."""
    cases = []
    for (N, d, heads), heights in L2_WALK:
        points = [(N, d, Br, heads) for Br in heights]
        expected = [bm.l2_bytes(*p) for p in points]
        cases.append(
            (
                f"N={N}, d={d}, heads={heads}, Br in {heights}",
                points,
                expected,
                1,
                "bytes",
                "fn",
                bm.l2_candidates,
                None,
            )
        )
    return check_exercise("check_l2_walk", fn, "fn(N, d, Br, heads) -> bytes", cases)
