"""Checkers for the softmax chapters: safe softmax, online softmax, merge, streaming sum.

Each checker runs the reader's function on ordinary and adversarial inputs
(scores near +-1000, the maximum in the first or the last block, ties, ragged
tails, block size 1 and larger than N, N = 1, -inf entries, rows of a batch),
compares with a float64 reference, and returns a ``CheckResult``.

When an answer is wrong, the checker also runs a set of known-wrong algorithms
(no rescaling, rescaling the wrong way, off-by-one tiles, ...) on the same
inputs. A mistake is named when the reader's outputs match what that wrong
algorithm returns: on every case if possible, otherwise on the failing case.

Tolerances. Every input is float64 and every expected value is computed in
float64. A correct float64 online softmax differs from the two-pass reference
only by rounding: at most N + N/Bc roundings of relative size 2**-53 = 1.1e-16
in ``l`` (N <= 37 here), plus the error of ``exp``, which is relative to its
argument (|x - m| * 1.1e-16 <= 2.2e-13 for scores spanning -1000 to 1000).
Measured on these inputs with block sizes 1, 2, 3, 64 and the cases' own, three
independent correct implementations (a per-row loop in Python floats,
flashref.online_softmax, a log-sum-exp softmax) agree to a relative 4.8e-14.
``RTOL = 1e-10`` leaves a factor of 2000 over that, while every named mistake
is wrong by 0.6 or more, or NaN, on some case. Softmax outputs are
probabilities whose row sums to 1, so an absolute error of ``ATOL = 1e-15``
(a few roundings of a value near 1) is relative to the row total; it lets
values below 1e-15 differ in the last bits of an underflowing ``exp``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..softmax import safe_softmax
from ..state import SoftmaxState
from ._report import CheckResult, Failure

RTOL = 1e-10  # see the module docstring
ATOL = 1e-15  # absolute, in units of the row total (softmax rows sum to 1)
MATCH_RTOL = 1e-6  # "the reader's output is what this wrong algorithm returns"

NO_RESCALE = "no rescaling of the running sum when the maximum grows"
NO_RESCALE_O = "no rescaling of the running output o when the maximum grows"
WRONG_WAY = "rescaling the wrong way (exp(m_new - m_old) instead of exp(m_old - m_new))"
OFF_BY_ONE = "off-by-one tile bounds (a score skipped or counted twice)"
NO_MAX = "not subtracting the maximum (overflow)"
NO_GUARD = "no guard for a block of only -inf scores (exp(-inf - (-inf)) is NaN)"
M0_ZERO = "running maximum started at 0 instead of -inf (all-negative rows give 0/0)"
BLOCK_NORM = "normalised each block by its own sum instead of the total"
TILE_AVERAGE = "averaged the per-tile results (the tiles' denominators differ)"
GLOBAL_MAX = "subtracted the maximum of the whole array instead of each row's"
MIN_SHIFT = "subtracted the minimum instead of the maximum"
WRONG_AXIS = "normalised along the wrong axis (softmax is along the last axis)"
MERGE_ONE = "forgot to rescale one of the two states"
MERGE_NONE = "forgot to rescale both states (added l directly)"
MERGE_OTHER = "used the other state's maximum"
MERGE_ADD = "added maxima"
MERGE_NO_GUARD = "no guard for two empty states (exp(-inf - (-inf)) is NaN)"


@dataclass
class _Case:
    label: str  # "scores near 1000: x (3, 20), block_size=4"
    args: tuple  # what fn is called with (copied before each call)
    expected: object  # the float64 reference
    compare: Callable  # (expected, got) -> problem string or None
    wrong: Callable  # () -> [(mistake name, what that wrong algorithm returns)]


def _run(exercise: str, fn, cases: list[_Case]) -> CheckResult:
    """Call ``fn`` on every case, collect failures, then name the likely mistakes."""
    result = CheckResult(exercise)
    ran = []  # (case, got, failure index or None)
    for case in cases:
        result.cases_run += 1
        args = [_copy(a) for a in case.args]  # fn may modify its inputs
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                got = fn(*args)
            except NotImplementedError:
                result.failures.append(Failure(case.label, "not implemented yet"))
                return result
            except Exception as exc:
                result.failures.append(Failure(case.label, f"raised {type(exc).__name__}: {exc}"))
                continue
        problem = case.compare(case.expected, got)
        if problem is None:
            ran.append((case, got, None))
            continue
        problem = "\n  " + problem  # the report prints "- case: problem": one line each
        heard = sorted({str(w.message) for w in caught})
        if heard:
            problem += f"\n  NumPy warned: {'; '.join(heard)}"
        ran.append((case, got, len(result.failures)))
        result.failures.append(Failure(case.label, problem))
    if any(i is not None for _, _, i in ran):
        _diagnose(result, ran)
    return result


def _diagnose(result: CheckResult, ran) -> None:
    """Name the wrong algorithms whose outputs match the reader's."""
    wrong = [case.wrong() for case, _, _ in ran]
    matches = []  # per case: names of wrong algorithms the reader's output equals
    for (case, got, _), predictions in zip(ran, wrong, strict=True):
        matches.append(
            {
                name
                for name, pred in predictions
                if _same(pred, got) and case.compare(case.expected, pred) is not None
            }
        )
    # A variant "explains" the reader if it matches on every case the reader ran,
    # including the ones that passed (where it must then agree with the reference).
    n_variants = len(wrong[0])
    everywhere = []
    for k in range(n_variants):
        name = wrong[0][k][0]
        if name not in everywhere and all(
            _same(w[k][1], got) for w, (_, got, _) in zip(wrong, ran, strict=True)
        ):
            everywhere.append(name)
    for (_, _, index), names in zip(ran, matches, strict=True):
        if index is None:
            continue
        named = [n for n in everywhere if n in names] or sorted(names)
        if named:
            failure = result.failures[index]
            result.failures[index] = Failure(failure.case, failure.problem, " or ".join(named))


def _same(pred, got) -> bool:
    """NaN-safe 'equal up to rounding' for arrays, floats and (m, l, o) triples."""
    if pred is None:
        return True  # a part the check does not look at (o of a state without values)
    if isinstance(pred, tuple):
        return all(_same(p, g) for p, g in zip(pred, _state_parts(got), strict=True))
    if got is None:
        return False
    try:
        g = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    p = np.asarray(pred, dtype=np.float64)
    if g.shape != p.shape and not (g.size == 1 == p.size):
        return False
    g, p = g.reshape(p.shape), p
    return bool(np.allclose(g, p, rtol=MATCH_RTOL, atol=ATOL, equal_nan=True))


# --- float64 simulation of a streaming pass, correct or with one planted mistake ----------


def _tiles(n: int, B: int, bounds: str) -> list[slice]:
    if bounds == "ok":
        starts, extra = range(0, n, B), 0
    elif bounds == "short":  # x[s : s + B - 1]: the last score of every tile is skipped
        starts, extra = range(0, n, B), -1
    elif bounds == "long":  # x[s : s + B + 1]: the next tile's first score counted twice
        starts, extra = range(0, n, B), 1
    elif bounds == "drop_tail":  # n // B tiles: a ragged tail is never visited
        starts, extra = range(0, n - n % B, B), 0
    elif bounds == "drop_last":  # range(0, n - B, B): the last tile is never visited
        starts, extra = range(0, n - B, B), 0
    else:  # "skip_first": range(1, n, B): the first score is never visited
        starts, extra = range(1, n, B), 0
    return [slice(s, min(s + B + extra, n)) for s in starts if min(s + B + extra, n) > s]


def _stream(
    s, v, B, *, alpha_l="right", alpha_o="right", shift=True, guard=True, m0=-np.inf, bounds="ok"
):
    """One row's (m, l, o, shift) after streaming ``s (N,)`` and ``v (N,)`` in tiles of B."""
    m, l, o, ref = m0, np.float64(0.0), np.float64(0.0), 0.0
    with np.errstate(all="ignore"):
        for t in _tiles(len(s), B, bounds):
            m_new = max(m, s[t].max()) if shift else 0.0
            ref = (0.0 if m_new == -np.inf else m_new) if guard else m_new
            right = np.exp(m - ref) if shift else 1.0
            if m == -np.inf and guard:
                wrong = 0.0  # a reader who starts from the first tile never rescales an empty l
            else:
                wrong = np.exp(m_new - m)
            alpha = {"right": right, "wrong": wrong, "none": 1.0}
            p = np.exp(s[t] - ref)  # (Bc,)
            l = l * alpha[alpha_l] + p.sum()
            o = o * alpha[alpha_o] + (p @ v[t] if v is not None else 0.0)
            m = m_new
    return m, l, o, ref


def _stream_variants(values: bool):
    """(name, keyword arguments of _stream) for each known-wrong streaming algorithm."""
    out = [(NO_GUARD, {"guard": False}), (M0_ZERO, {"m0": 0.0}), (NO_MAX, {"shift": False})]
    for guard in (True, False):
        out += [
            (NO_RESCALE, {"alpha_l": "none", "alpha_o": "none", "guard": guard}),
            (WRONG_WAY, {"alpha_l": "wrong", "alpha_o": "wrong", "guard": guard}),
        ]
        if values:
            out += [
                (NO_RESCALE, {"alpha_l": "none", "guard": guard}),
                (NO_RESCALE_O, {"alpha_o": "none", "guard": guard}),
            ]
        for bounds in ("short", "long", "drop_tail", "drop_last", "skip_first"):
            out.append((OFF_BY_ONE, {"bounds": bounds, "guard": guard}))
    return out


def _rows(x: np.ndarray, row_fn) -> np.ndarray:
    """Apply ``row_fn (N,) -> (N,)`` to every row of x (1-D or 2-D)."""
    with np.errstate(all="ignore"):
        return np.stack([row_fn(r) for r in x.reshape(-1, x.shape[-1])]).reshape(x.shape)


def _wrong_online_softmax(x: np.ndarray, B: int):
    def streamed(kwargs):
        def row(r):
            _, l, _, ref = _stream(r, None, B, **kwargs)
            return np.exp(r - ref) / l

        return _rows(x, row)

    def per_block(r):
        out = np.empty_like(r)
        for t in _tiles(len(r), B, "ok"):
            e = np.exp(r[t] - r[t].max())
            out[t] = e / e.sum()
        return out

    wrong = [(name, streamed(kw)) for name, kw in _stream_variants(values=False)]
    return wrong + [(BLOCK_NORM, _rows(x, per_block))]


def _compare_array(expected: np.ndarray, got, scale=None, what: str = "position") -> str | None:
    """NaN-safe relative comparison, naming the worst element by row and column.

    The tolerance is ``ATOL + RTOL * |expected|``, or ``RTOL * scale`` when a
    scale (the size of the terms that were summed) is given.
    """
    if isinstance(got, np.generic | list | tuple | float):
        try:
            got = np.asarray(got, dtype=np.float64)
        except (TypeError, ValueError):
            pass
    if not isinstance(got, np.ndarray):
        return f"expected a numpy array, got {type(got).__name__}"
    if got.shape != expected.shape:
        return f"expected shape {expected.shape}, got shape {got.shape}"
    if got.dtype != expected.dtype:
        return f"expected dtype {expected.dtype} (the input's), got {got.dtype}"
    with np.errstate(invalid="ignore"):
        err = np.abs(got - expected)
    err = np.where(np.isnan(got) | np.isnan(err), np.inf, err)  # a NaN never passes
    err = np.where(got == expected, 0.0, err)  # equal infinities and zeros match
    tol = ATOL + RTOL * np.abs(expected) if scale is None else RTOL * scale
    excess = err - tol
    if (excess <= 0).all():
        return None
    idx = np.unravel_index(int(np.argmax(excess)), excess.shape)
    if len(idx) == 0:
        where = "value"
    elif len(idx) == 1:
        where = f"{what} {idx[0]}"
    else:
        where = f"row {idx[0]}, column {idx[1]}"
    return f"{where}: expected {expected[idx]:.6g}, got {got[idx]:.6g}"


def _copy(a):
    if isinstance(a, SoftmaxState):
        return SoftmaxState(a.m.copy(), a.l.copy(), None if a.o is None else a.o.copy())
    return a.copy() if isinstance(a, np.ndarray) else a


# --- inputs -------------------------------------------------------------------------------


def _rising(rng, shape, lo, hi) -> np.ndarray:
    """Scores that trend from lo to hi along the last axis: the maximum grows block by block."""
    return np.linspace(lo, hi, shape[-1]) + rng.uniform(-0.5, 0.5, shape)


def _softmax_inputs() -> list[tuple[str, np.ndarray, int]]:
    """(description, x float64, block size) for the softmax checkers."""
    rng = np.random.default_rng(20240601)
    x_inf = rng.normal(0.0, 2.0, (3, 18))
    x_inf[rng.random((3, 18)) < 0.3] = -np.inf
    x_inf[:, 5] = 1.0  # every row keeps at least one finite score
    x_lead = rng.normal(0.0, 2.0, (2, 12))
    x_lead[:, :4] = -np.inf  # a whole first block masked, as with left padding
    far = np.stack([1000.0 + _rising(rng, (9,), 0, 4), -1000.0 + _rising(rng, (9,), 0, 4)])
    return [
        ("ordinary scores", rng.normal(0.0, 2.0, 37), 8),
        ("rows of a batch", rng.normal(0.0, 3.0, (4, 29)), 5),
        (
            "scores near 1000, rising: the maximum in the last block",
            1000 + _rising(rng, (3, 20), 0, 12),
            4,
        ),
        ("scores near -1000", -1000.0 + _rising(rng, (2, 23), -6, 6), 6),
        ("maximum in the first block", _rising(rng, (17,), 8, -8), 4),
        ("ties: the maximum repeated in several blocks", rng.choice([0.0, 2.0, 5.0], (3, 16)), 4),
        ("one row near 1000, one near -1000", far, 3),
        ("block size 1", _rising(rng, (2, 11), -3, 3), 1),
        ("block size larger than N", _rising(rng, (2, 7), -3, 3), 16),
        (
            "scores spanning -1000 to 1000 in one row",
            rng.permutation(np.linspace(-1e3, 1e3, 15)),
            2,
        ),
        ("-inf entries (masked scores)", x_inf, 4),
        ("a whole first block of -inf", x_lead, 4),
        ("N = 1", rng.normal(0.0, 1.0, (3, 1)), 2),
    ]


# --- safe softmax ---------------------------------------------------------------------------


def _wrong_safe_softmax(x: np.ndarray):
    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        e_min = np.exp(x - x.min(axis=-1, keepdims=True))
        e_global = np.exp(x - x.max())
        e_col = np.exp(x - x.max(axis=0, keepdims=True))
        return [
            (NO_MAX, np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)),
            (GLOBAL_MAX, e_global / e_global.sum(axis=-1, keepdims=True)),
            (MIN_SHIFT, e_min / e_min.sum(axis=-1, keepdims=True)),
            (WRONG_AXIS, e / e.sum(axis=0, keepdims=True)),
            (WRONG_AXIS, e / e.sum()),
            (WRONG_AXIS, e_col / e_col.sum(axis=-1, keepdims=True)),
        ]


def check_safe_softmax(fn) -> CheckResult:
    """Check ``fn(x) -> softmax of x along the last axis`` (x float64, 1-D or 2-D)."""
    cases = [
        _Case(
            f"{desc}: x {x.shape}",
            (x,),
            safe_softmax(x),
            _compare_array,
            lambda x=x: _wrong_safe_softmax(x),
        )
        for desc, x, _ in _softmax_inputs()
        if not desc.startswith("block size")  # those two only vary the block size
    ]
    return _run("check_safe_softmax", fn, cases)


# --- online softmax -------------------------------------------------------------------------


def _wrong_online_softmax(x: np.ndarray, B: int):
    def streamed(kwargs):
        def row(r):
            _, l, _, ref = _stream(r, None, B, **kwargs)
            return np.exp(r - ref) / l

        return _rows(x, row)

    def per_block(r):
        out = np.empty_like(r)
        for t in _tiles(len(r), B, "ok"):
            e = np.exp(r[t] - r[t].max())
            out[t] = e / e.sum()
        return out

    wrong = [(name, streamed(kw)) for name, kw in _stream_variants(values=False)]
    return wrong + [(BLOCK_NORM, _rows(x, per_block))]


def check_online_softmax(fn) -> CheckResult:
    """Check ``fn(x, block_size) -> softmax of x along the last axis``, streamed in blocks.

    ``x`` is float64, 1-D ``(N,)`` or 2-D ``(rows, N)``; the answer must be
    float64 of the same shape and equal the two-pass softmax up to rounding.
    """
    cases = [
        _Case(
            f"{desc}: x {x.shape}, block_size={B}",
            (x, B),
            safe_softmax(x),
            _compare_array,
            lambda x=x, B=B: _wrong_online_softmax(x, B),
        )
        for desc, x, B in _softmax_inputs()
    ]
    return _run("check_online_softmax", fn, cases)


# --- streaming weighted sum -----------------------------------------------------------------


def _compare_float(expected: tuple[float, float], got) -> str | None:
    """``expected`` is (value, scale): the tolerance is RTOL * sum(p * |v|)."""
    value, scale = expected
    try:
        g = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return f"expected a float, got {type(got).__name__}"
    if g.size != 1:
        return f"expected a single float, got an array of shape {g.shape}"
    g = float(g.reshape(()))
    if not abs(g - value) <= RTOL * scale:  # NaN fails this test
        return f"expected {value:.9g}, got {g:.9g}"
    return None


def _wrong_weighted_sums(s: np.ndarray, v: np.ndarray, B: int):
    out = []
    for name, kwargs in _stream_variants(values=True):
        _, l, o, _ = _stream(s, v, B, **kwargs)
        with np.errstate(all="ignore"):
            out.append((name, o / l))
    with np.errstate(all="ignore"):
        per_tile = []
        for t in _tiles(len(s), B, "ok"):
            p = np.exp(s[t] - s[t].max())
            per_tile.append(p @ v[t] / p.sum())
    return out + [(TILE_AVERAGE, float(np.mean(per_tile)))]


def check_streaming_weighted_sum(fn) -> CheckResult:
    """Check ``fn(scores, values, tile_size) -> sum(softmax(scores) * values)`` (a float).

    ``scores`` and ``values`` are float64 of shape ``(N,)``. The tolerance is
    relative to ``sum(p * |values|)``, the size of the terms being added, so
    results that cancel to nearly 0 are judged fairly.
    """
    rng = np.random.default_rng(20240602)
    seed_scores = 1000.0 + np.log(np.arange(1.0, 5.0))
    seed_values = np.array([10.0, 20.0, 30.0, 40.0])
    inputs = [
        (
            "the worked example (1000 + log i; values 10, 20, 30, 40)",
            seed_scores,
            seed_values,
            B,
        )
        for B in (1, 2, 4)
    ]
    for desc, x, B in _softmax_inputs():
        for r, row in enumerate(np.atleast_2d(x)[:2]):
            label = f"{desc}, example {r + 1}" if np.ndim(x) == 2 else desc
            inputs.append((label, row, rng.normal(0.0, 5.0, row.shape), B))
    cases = []
    for desc, s, v, B in inputs:
        p = safe_softmax(s)
        expected = (math.fsum(p * v), math.fsum(p * np.abs(v)))
        cases.append(
            _Case(
                f"{desc}: scores {s.shape}, tile_size={B}",
                (s, v, B),
                expected,
                _compare_float,
                lambda s=s, v=v, B=B: _wrong_weighted_sums(s, v, B),
            )
        )
    return _run("check_streaming_weighted_sum", fn, cases)


# --- merging two states ---------------------------------------------------------------------


def _state_parts(got):
    return (getattr(got, "m", None), getattr(got, "l", None), getattr(got, "o", None))


def _compare_state(expected, got) -> str | None:
    """``expected`` is (m, l, o, |o| scale); m and l relative, o relative to the scale."""
    m, l, o, o_scale = expected
    if not (hasattr(got, "m") and hasattr(got, "l")):
        return f"expected a SoftmaxState (with .m and .l), got {type(got).__name__}"
    for name, e, g, scale in (
        ("m", m, got.m, None),
        ("l", l, got.l, None),
        ("o", o, got.o, o_scale),
    ):
        if e is None:
            continue
        problem = _compare_array(e, g, scale, what="row")
        if problem:
            return f"{name}, {problem}"
    return None


def _wrong_merges(a: SoftmaxState, b: SoftmaxState):
    with np.errstate(all="ignore"):
        m = np.maximum(a.m, b.m)
        ref = np.where(np.isneginf(m), 0.0, m)  # the shift used by a correct merge
        one = np.ones_like(m)

        def merged(m_out, alpha_a, alpha_b):
            l = a.l * alpha_a + b.l * alpha_b
            o = None if a.o is None else a.o * alpha_a[..., None] + b.o * alpha_b[..., None]
            return (m_out, l, o)

        added = a.m + b.m
        return [
            (MERGE_NO_GUARD, merged(m, np.exp(a.m - m), np.exp(b.m - m))),
            (MERGE_ONE, merged(m, np.exp(a.m - ref), one)),
            (MERGE_ONE, merged(m, one, np.exp(b.m - ref))),
            (MERGE_NONE, merged(m, one, one)),
            (MERGE_OTHER, merged(m, np.exp(b.m - ref), np.exp(a.m - ref))),
            (MERGE_OTHER, merged(a.m, one, np.exp(b.m - a.m))),
            (MERGE_OTHER, merged(b.m, np.exp(a.m - b.m), one)),
            (MERGE_ADD, merged(added, np.exp(a.m - added), np.exp(b.m - added))),
            (MERGE_ADD, merged(added, np.exp(a.m - ref), np.exp(b.m - ref))),
        ]


def check_merge_states(fn, with_o: bool = False) -> CheckResult:
    """Check ``fn(a, b) -> SoftmaxState`` merging two partial states over disjoint scores.

    The states have rows of shape ``(R,)``; ``m`` must be the larger maximum and
    ``l`` the sum over both score sets on that scale. With ``with_o=True`` the
    states also carry an unnormalised output ``o (R, dv)`` that must be merged too.
    """
    rng = np.random.default_rng(20240603)
    empty = np.full(5, -np.inf)

    def rows(*rs):
        return np.stack(rs)

    pairs = [
        ("a holds the larger maximum", rows(_rising(rng, (6,), 2, 9)), rows(rng.normal(0, 1, 5))),
        ("b holds the larger maximum", rows(rng.normal(0, 1, 6)), rows(_rising(rng, (5,), 2, 9))),
        ("rows of a batch", rng.normal(0, 3, (4, 6)), rng.normal(0, 3, (4, 5))),
        ("equal maxima (ties)", rows([1.0, 4.0, 4.0, 0.0, 2.0, 3.0]), rows([4.0, 4.0, -1, 0, 2])),
        (
            "a near 1000, b near -1000",
            1000 + rng.normal(0, 2, (3, 6)),
            -1000 + rng.normal(0, 2, (3, 5)),
        ),
        (
            "a near -1000, b near 1000",
            -1000 + rng.normal(0, 2, (3, 6)),
            1000 + rng.normal(0, 2, (3, 5)),
        ),
        ("both near 1000", 1000 + rng.normal(0, 2, (2, 6)), 1003 + rng.normal(0, 2, (2, 5))),
        (
            "one state empty (m = -inf, l = 0)",
            rows(np.full(6, -np.inf), rng.normal(0, 1, 6)),
            rows(rng.normal(0, 1, 5), empty),
        ),
        (
            "both states empty in row 0",
            rows(np.full(6, -np.inf), rng.normal(0, 1, 6)),
            rows(empty, rng.normal(0, 1, 5)),
        ),
    ]
    cases = []
    for desc, s_a, s_b in pairs:
        # The rows are queries sharing one set of keys and values, as in attention.
        v_a = rng.normal(0, 1, (s_a.shape[-1], 3)) if with_o else None  # (n_a, dv)
        v_b = rng.normal(0, 1, (s_b.shape[-1], 3)) if with_o else None  # (n_b, dv)
        a, b = SoftmaxState.from_scores(s_a, v_a), SoftmaxState.from_scores(s_b, v_b)
        s = np.concatenate([s_a, s_b], axis=-1)  # (R, n_a + n_b)
        v = None if v_a is None else np.concatenate([v_a, v_b])  # (n_a + n_b, dv)
        ref = SoftmaxState.from_scores(s, v)
        o_scale = None if v is None else SoftmaxState.from_scores(s, np.abs(v)).o
        cases.append(
            _Case(
                f"{desc}: rows {a.m.shape}" + (f", dv={v.shape[-1]}" if with_o else ""),
                (a, b),
                (ref.m, ref.l, ref.o, o_scale),
                _compare_state,
                lambda a=a, b=b: _wrong_merges(a, b),
            )
        )
    return _run("check_merge_states", fn, cases)
