"""Checkers for the ring attention chapter: the schedule, the zigzag shard, one device's step.

``check_held_positions(fn)`` runs ``fn(N, world_size, layout, step, device)`` and
wants the global positions of the K/V block that ``device`` holds at ``step``, as an
int array ``(N / world_size,)`` in increasing order: every block starts on the
device of its number and moves one place round the ring (``r -> r + 1``) after
every step, carrying the positions that device holds under ``layout``
(``flashref.shard_positions`` gives those).

``check_zigzag_positions(fn)`` runs ``fn(N, world_size, device)`` and wants the
positions ``device`` holds under the zigzag layout: of ``2W`` equal chunks, chunk
``r`` and chunk ``2W - 1 - r``, in increasing order (``W = world_size``).

``check_device_step(fn)`` runs ``fn(Q, P_q, K, V, P_k, causal)`` with ``Q (n_q, d)``
at global positions ``P_q (n_q,)`` and a held block ``K (n_k, d)``, ``V (n_k, dv)``
at ``P_k (n_k,)``, float64, scale ``1/sqrt(d)``, and wants the pair ``(O, lse)`` of
that step alone: ``O (n_q, dv)``, ``lse (n_q,)``, with key ``j`` visible to query
``i`` when ``causal`` is False or ``P_k[j] <= P_q[i]``; a row that sees no key gives
``O = 0`` and ``lse = -inf``, so that ``SoftmaxState.from_output`` makes it an empty
state that merges as nothing.

Positions are compared exactly. A step's ``O`` is judged against ``TOL x max|V|``
and its ``lse`` against ``TOL`` absolute, because an error ``e`` in ``lse`` scales the
step's weight in the merge by ``exp(e)``, a relative error ``e`` in its share of the
output. ``TOL`` is the tiled checker's (``attention.TOL``): a float64 answer lands
within ~1e-13 whatever its order of operations, a float32 one misses on scores near
1000 (each rounded by ~6e-5) and is called float32 precision, and every mistake of
``_ring_mistakes`` misses by more than 0.1, or gives NaN, on a case that exposes it
(``tests/exercises/test_exercises_ring.py`` plants each one).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..ring import shard_positions
from . import _ring_mistakes as rm
from ._answer import (
    TIGHT,
    excess,
    first_wrong_o_lse,
    not_an_array,
    o_lse_answer,
)
from ._cases import project_scores
from ._report import CheckResult, Failure
from ._run import Case, check_callable, checker, float32_band, run
from .attention import TOL

__all__ = ["check_held_positions", "check_zigzag_positions", "check_device_step"]


# --- positions: the schedule and the zigzag shard --------------------------------------------


def runs(P) -> str:
    """Positions as runs of consecutive numbers: ``0-3, 28-31``."""
    P = np.asarray(P)
    if P.size == 0:
        return "none"
    cuts = np.flatnonzero(np.diff(P) != 1) + 1
    parts = [f"{s[0]}-{s[-1]}" if len(s) > 1 else f"{s[0]}" for s in np.split(P, cuts)]
    return ", ".join(parts if len(parts) <= 6 else parts[:6] + ["..."])


def _positions_answer(got, n):
    """Accept a plain integer ndarray of shape ``(n,)``."""
    if isinstance(got, tuple):
        return None, f"expected one array of positions, got a tuple of {len(got)} values"
    problem = not_an_array(got, "the positions")
    if problem:
        return None, problem
    if got.shape != (n,):
        return None, f"expected {n} positions, shape ({n},), got shape {got.shape}"
    if got.dtype.kind not in "iu":
        return None, f"expected an integer array (positions index the sequence), got {got.dtype}"
    return got.astype(np.int64), None


def _positions_case(label, args, expected, blocks, wrong) -> Case:
    """A case whose answer is ``expected``, exactly; ``blocks`` name known position sets."""

    def which(P):
        b = next((b for b, B in enumerate(blocks) if np.array_equal(B, P)), None)
        return "" if b is None else f" (block {b})"

    return Case(
        label,
        args,
        expected,
        accept=lambda got: _positions_answer(got, len(expected)),
        distance=lambda P: 0.0 if np.array_equal(P, expected) else np.inf,
        describe=lambda P: f"expected {runs(expected)}{which(expected)}, got {runs(P)}{which(P)}",
        within_float32=lambda P: False,  # exact integers: no rounding to blame
        wrong=wrong,
    )


def name_mistakes(result: CheckResult, ran, matches) -> None:
    """Name, on each failing case, the mistakes ``matches(case, value)`` finds there.

    A mistake found on every failing case explains them all and is the one named
    where it is found; otherwise each case gets the names found on it.
    """
    failing = [(case, value, index) for case, value, index in ran if index is not None]
    found = [matches(case, value) for case, value, _ in failing]
    everywhere = set.intersection(*map(set, found)) if found else set()
    for (_, _, index), names in zip(failing, found, strict=True):
        named = [n for n in names if n in everywhere] or names
        if named:
            f = result.failures[index]
            result.failures[index] = Failure(f.case, f.problem, " or ".join(named))


def _position_mistakes(case, P) -> list[str]:
    names = []
    for name, candidate in case.wrong():
        wrong = not np.array_equal(candidate, case.expected)
        if wrong and np.array_equal(candidate, P) and name not in names:
            names.append(name)
    if not names and np.array_equal(np.sort(P), case.expected):
        names.append(rm.UNSORTED)
    return names


# (N, world_size, layout, [(step, device), ...]): every step of rings of 3 and 4 devices
# (the direction shows only with 3 or more: with 2, r + s and r - s are the same block),
# rings of 1, 2, 5 and 8, and zigzag chunks of one position.
HELD = [
    (5, 1, "contiguous", [(0, 0)]),
    (8, 2, "zigzag", [(1, 0)]),
    (12, 3, "contiguous", [(0, 2), (1, 0), (1, 2), (2, 1)]),
    (24, 4, "zigzag", [(0, 1), (1, 0), (2, 3), (3, 1)]),
    (15, 5, "contiguous", [(4, 0), (2, 4)]),
    (16, 8, "zigzag", [(5, 2), (7, 7)]),
]


@checker
def check_held_positions(fn) -> CheckResult:
    """Check ``fn(N, world_size, layout, step, device) -> positions (N / world_size,)``.

    The positions of the K/V block that ``device`` holds at ``step`` (see the module
    docstring), for both layouts, 1 to 8 devices, and every step of small rings.
    """
    check_callable(fn, "fn(N, world_size, layout, step, device) -> positions")
    cases = []
    for N, W, layout, calls in HELD:
        shards = shard_positions(N, W, layout)
        contiguous = shard_positions(N, W) if layout == "zigzag" else None
        for s, r in calls:
            label = f"N={N}, world_size={W}, layout={layout!r}, step={s}, device={r}"
            wrong = lambda sh=shards, W=W, s=s, r=r, c=contiguous: rm.held_candidates(  # noqa: E731
                sh, W, s, r, c
            )
            cases.append(
                _positions_case(label, (N, W, layout, s, r), shards[(r - s) % W], shards, wrong)
            )
    return run(
        "check_held_positions", fn, cases, partial(name_mistakes, matches=_position_mistakes)
    )


ZIGZAG = [(4, 1, 0), (8, 2, 0), (8, 2, 1), (12, 3, 0), (12, 3, 1), (12, 3, 2), (24, 4, 1)]
ZIGZAG += [(24, 4, 3), (40, 5, 2), (6, 3, 0), (64, 8, 7)]  # (N, world_size, device)


@checker
def check_zigzag_positions(fn) -> CheckResult:
    """Check ``fn(N, world_size, device) -> positions (N / world_size,)`` under zigzag.

    Chunks ``device`` and ``2W - 1 - device`` of ``2W``, in increasing order; cases
    include one device, chunks of one position and every device of a ring of three.
    """
    check_callable(fn, "fn(N, world_size, device) -> positions")
    cases = []
    for N, W, r in ZIGZAG:
        shards = shard_positions(N, W, "zigzag")
        label = f"N={N}, world_size={W}, device={r}"
        wrong = lambda N=N, W=W, r=r: rm.zigzag_candidates(N, W, r)  # noqa: E731
        cases.append(_positions_case(label, (N, W, r), shards[r], [], wrong))
    return run(
        "check_zigzag_positions", fn, cases, partial(name_mistakes, matches=_position_mistakes)
    )


# --- one device, one step ----------------------------------------------------------------------


def _step_answer(got, n_q, dv):
    """Accept a tuple ``(O (n_q, dv), lse (n_q,))`` of plain float arrays."""
    return o_lse_answer(got, n_q, dv, "the lse is what lets the step merge")


def _describe_step(O_ref, lse_ref, tols, seen, value):
    """The first wrong row of O, or else of lse: expected against got."""
    tol_text = {"O": f"{TOL:g} x max|V|", "lse": f"{TOL:g}"}

    def note(r):
        return "" if seen[r] else f"row {r} sees no key of the block; "

    return first_wrong_o_lse(O_ref, lse_ref, tols, value, tol_text, note)


def _step_case(label, Q, P_q, K, V, P_k, causal) -> Case:
    O_ref, lse_ref = rm.step_reference(Q, P_q, K, V, P_k, causal)
    seen = np.isfinite(lse_ref)  # (n_q,) rows that see a key
    max_v = float(np.abs(V).max())
    tols = (TOL * max_v, TOL)
    d, n_k = Q.shape[1], K.shape[0]
    top_score = np.linalg.norm(Q, axis=1).max() * np.linalg.norm(K, axis=1).max() / np.sqrt(d)
    magnitude = top_score + d + n_k  # what float32 rounds (see _run)
    tols32 = (float32_band(magnitude * max_v), float32_band(magnitude))

    def distance(value, tols=tols):
        return max(
            float(excess(e, g, t).max(initial=0.0))
            for e, g, t in zip((O_ref, lse_ref), value, tols, strict=True)
        )

    return Case(
        f"{label}: P_q {runs(P_q)}, P_k {runs(P_k)}, causal={causal}",
        (Q, P_q, K, V, P_k, causal),
        (O_ref, lse_ref),
        accept=lambda got: _step_answer(got, len(Q), V.shape[1]),
        distance=distance,
        describe=lambda value: _describe_step(O_ref, lse_ref, tols, seen, value),
        within_float32=lambda value: distance(value, tols32) <= 1,
        wrong=(lambda: rm.step_candidates(Q, P_q, K, V, P_k, causal), tols, distance),
    )


def _step_mistakes(case, value) -> list[str]:
    """The step mistakes whose (O, lse) equals the reader's, NaN matching NaN."""
    simulate, tols, distance = case.wrong

    def same(a, b, scale=1.0):
        return all(
            (excess(x, y, t * scale, nan_matches=True) <= 1).all()
            for x, y, t in zip(a, b, tols, strict=True)
        )

    names = []
    for name, O_c, lse_c, rows in simulate():
        if rows is not None:  # the mistake's lse is defined on these rows only
            lse_c = np.where(rows, lse_c, value[1])
        if name in names or not same((O_c, lse_c), value) or distance((O_c, lse_c)) <= 1:
            continue  # another answer, or not wrong on this case
        if same((O_c, lse_c), value, TIGHT / TOL) or not case.within_float32((O_c, lse_c)):
            names.append(name)
    return names


def _step_cases():
    """(label, Q, P_q, K, V, P_k, causal): blocks before, on, after and across the diagonal."""
    rng = np.random.default_rng(2025)
    cases = []
    for desc, N, W, layout, s, r, causal in [
        ("contiguous", 32, 4, "contiguous", 0, 1, True),  # the diagonal block
        ("contiguous", 32, 4, "contiguous", 1, 2, True),  # a block before the queries
        ("contiguous", 32, 4, "contiguous", 2, 1, True),  # a block after the queries
        ("contiguous", 32, 4, "contiguous", 2, 1, False),
        ("zigzag", 36, 3, "zigzag", 0, 2, True),  # its own two chunks
        ("zigzag", 36, 3, "zigzag", 1, 0, True),  # another device's chunks
        ("zigzag", 36, 3, "zigzag", 2, 2, True),
        ("zigzag", 36, 3, "zigzag", 1, 0, False),
        ("one position each, contiguous", 4, 4, "contiguous", 1, 1, True),
    ]:
        shards = shard_positions(N, W, layout)
        P_q, P_k = shards[r], shards[(r - s) % W]
        d, dv = (8, 5) if layout == "contiguous" else (6, 3)
        Q, K, V = _qkv(rng, P_q, P_k, d, dv)
        label = f"{desc} W={W}, device {r} at step {s}"
        cases.append((label, Q, P_q, K, V, P_k, causal))
    # Blocks of different lengths at interleaved positions.
    P_q, P_k = np.array([3, 10, 11]), np.array([0, 1, 2, 12, 13])
    Q, K, V = _qkv(rng, P_q, P_k, 8, 4)
    cases.append(("blocks of different lengths", Q, P_q, K, V, P_k, True))
    # Scores near 1000 rising along the keys, on the diagonal block of a zigzag ring.
    P = shard_positions(32, 2, "zigzag")[1]  # (16,)
    Q, K, V = _qkv(rng, P, P, 8, 4)
    direction = Q.mean(axis=0)
    K = project_scores(direction, K, 990.0 + np.linspace(0.0, 10.0, len(P)))
    Q = direction + 0.02 * (Q - direction)  # queries close to the mean: similar scores
    cases.append(("scores near 1000, W=2, device 1 at step 0", Q, P, K, V, P, True))
    return cases


def _qkv(rng, P_q, P_k, d, dv):
    return (
        rng.standard_normal((len(P_q), d)),
        rng.standard_normal((len(P_k), d)),
        rng.standard_normal((len(P_k), dv)),
    )


@checker
def check_device_step(fn) -> CheckResult:
    """Check ``fn(Q, P_q, K, V, P_k, causal) -> (O, lse)``: one device's step of the ring.

    See the module docstring. Cases: blocks before, on and after the queries'
    positions with contiguous shards, interleaved zigzag shards, blocks in which some
    or every row sees no key, one position per block, blocks of different lengths, and
    scores near 1000.
    """
    check_callable(fn, "fn(Q, P_q, K, V, P_k, causal) -> (O, lse)")
    cases = [_step_case(*case) for case in _step_cases()]
    return run("check_device_step", fn, cases, partial(name_mistakes, matches=_step_mistakes))
