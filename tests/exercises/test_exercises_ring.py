"""The ring chapter's checkers accept correct solutions and name planted mistakes.

The correct solutions are written the way a reader might, by chunk arithmetic and
with NumPy, not through flashref's ring code; each planted mistake is one a reader
makes (the ring turning the wrong way, a step off by one, zigzag chunk 2W - r, the
causal mask from local positions...), and the test asserts that the report names it.
The checkers also keep the rules every checker follows (test_exercises_rules.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from reference import no_warnings

import flashref
import flashref.exercises
from flashref import shard_positions
from flashref.exercises import _ring_mistakes as rm
from flashref.exercises import check_device_step, check_held_positions, check_zigzag_positions
from flashref.exercises._report import NOT_IMPLEMENTED, PRECISION


def flat(result) -> str:
    """A report on one line: a long mistake name is wrapped over two lines when printed."""
    return " ".join(str(result).split())


@pytest.fixture(autouse=True)
def every_warning_is_an_error():
    """A checker must not warn on its own, whatever it is given (as under python -W error)."""
    with no_warnings():
        yield


# --- solutions: the schedule ------------------------------------------------------------------


def chunk(N, W, i):
    c = N // (2 * W)
    return np.arange(i * c, (i + 1) * c)


def held(block_of=lambda W, s, r: (r - s) % W, layout_of=lambda layout: layout):
    """The positions device r holds at step s, with the block and the layout chosen by rules."""

    def fn(N, W, layout, step, device):
        b = block_of(W, step, device)
        if layout_of(layout) == "contiguous":
            n = N // W
            return np.arange(b * n, (b + 1) * n)
        return np.concatenate([chunk(N, W, b), chunk(N, W, 2 * W - 1 - b)])

    return fn


def held_with_library(N, W, layout, step, device):
    return shard_positions(N, W, layout)[(device - step) % W]


def test_held_positions_accepts_correct_solutions():
    result = check_held_positions(held())
    assert result, str(result)
    assert result.cases_run >= 12 and str(result).endswith("cases passed")
    assert check_held_positions(held_with_library)


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (held(block_of=lambda W, s, r: (r + s) % W), rm.RING_DIRECTION),
        (held(block_of=lambda W, s, r: (r - s - 1) % W), rm.OFF_BY_ONE_STEP),
        (held(block_of=lambda W, s, r: (r - s + 1) % W), rm.OFF_BY_ONE_STEP),
        (held(block_of=lambda W, s, r: r), rm.NO_MOVE),
        (held(layout_of=lambda layout: "contiguous"), rm.LAYOUT_IGNORED),
    ],
    ids=["direction", "one_ahead", "one_behind", "no_move", "layout_ignored"],
)
def test_held_positions_names_planted_mistake(fn, name):
    result = check_held_positions(fn)
    text = flat(result)
    assert not result
    assert f"likely mistake: {name}" in text, text
    assert "expected" in text and "got" in text and "(block " in text
    diagnosed = [f.diagnosis for f in result.failures if f.diagnosis]
    assert diagnosed and all(d == name for d in diagnosed), diagnosed


def test_held_positions_says_which_block_came_back():
    result = check_held_positions(held(block_of=lambda W, s, r: (r + s) % W))
    first = result.failures[0]
    assert first.case == "N=12, world_size=3, layout='contiguous', step=1, device=0"
    assert first.problem == "expected 8-11 (block 2), got 4-7 (block 1)"


def test_held_positions_unsorted_is_named():
    def reversed_chunks(N, W, layout, step, device):
        return held()(N, W, layout, step, device)[::-1].copy()

    result = check_held_positions(reversed_chunks)
    assert not result and f"likely mistake: {rm.UNSORTED}" in flat(result)


# --- solutions: the zigzag shard -----------------------------------------------------------------


def zigzag(first=lambda W, r: r, second=lambda W, r: 2 * W - 1 - r):
    """Chunks first(W, r) and second(W, r) of 2W, by arithmetic (the reader's usual code)."""

    def fn(N, W, device):
        return np.concatenate([chunk(N, W, first(W, device)), chunk(N, W, second(W, device))])

    return fn


def zigzag_by_reshape(N, W, device):
    chunks = np.arange(N).reshape(2 * W, -1)  # (2W, N / 2W)
    return np.concatenate([chunks[device], chunks[2 * W - 1 - device]])


def test_zigzag_positions_accepts_correct_solutions():
    result = check_zigzag_positions(zigzag())
    assert result, str(result)
    assert result.cases_run >= 10
    assert check_zigzag_positions(zigzag_by_reshape)
    assert check_zigzag_positions(lambda N, W, r: shard_positions(N, W, "zigzag")[r])


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (zigzag(second=lambda W, r: 2 * W - r), rm.ZIGZAG_2W),
        (zigzag(second=lambda W, r: W + r), rm.ZIGZAG_SAME_ORDER),
        (lambda N, W, r: np.arange(r * N // W, (r + 1) * N // W), rm.CONTIGUOUS),
        (lambda N, W, r: np.arange(r, N, W), rm.STRIPED),
        (zigzag(first=lambda W, r: 2 * W - 1 - r, second=lambda W, r: r), rm.UNSORTED),
    ],
    ids=["2W-r", "W+r", "contiguous", "striped", "unsorted"],
)
def test_zigzag_positions_names_planted_mistake(fn, name):
    result = check_zigzag_positions(fn)
    text = flat(result)
    assert not result
    assert f"likely mistake: {name}" in text, text
    diagnosed = [f.diagnosis for f in result.failures if f.diagnosis]
    assert diagnosed and all(d == name for d in diagnosed), diagnosed


def test_zigzag_2w_by_indexing_raises_on_device_0_and_is_named_elsewhere():
    def by_index(N, W, device):
        chunks = np.arange(N).reshape(2 * W, -1)
        return np.concatenate([chunks[device], chunks[2 * W - device]])  # IndexError for 0

    result = check_zigzag_positions(by_index)
    text = flat(result)
    assert "raised IndexError" in text
    assert f"likely mistake: {rm.ZIGZAG_2W}" in text


# --- solutions: one device's step -------------------------------------------------------------


def step(mask="global", fill=-np.inf, guard=True, lse_rule="m + log l", scaled=True, dtype=None):
    """One device's step written with NumPy, with one planted mistake chosen by its arguments."""

    def fn(Q, P_q, K, V, P_k, causal):
        if dtype is not None:
            Q, K, V = (x.astype(dtype) for x in (Q, K, V))
        S = Q @ K.T / (np.sqrt(Q.shape[1]) if scaled else 1)  # (n_q, n_k)
        if causal and mask != "none":
            i, j = {
                "global": (P_q, P_k),
                "local": (np.arange(len(P_q)), np.arange(len(P_k))),
            }.get(mask, (P_q, P_k))
            allowed = {"strict": j[None, :] < i[:, None], "flipped": j[None, :] >= i[:, None]}
            S = np.where(allowed.get(mask, j[None, :] <= i[:, None]), S, fill)
        m = S.max(axis=1)  # (n_q,)
        shift = np.where(np.isneginf(m), 0, m) if guard else m
        if lse_rule == "no shift":
            shift = np.zeros_like(m)
        P = np.exp(S - shift[:, None])  # (n_q, n_k)
        l = P.sum(axis=1)
        o = P @ V  # (n_q, dv)
        if guard and lse_rule != "no shift":
            O = np.divide(o, l[:, None], out=np.zeros_like(o), where=l[:, None] > 0)
        else:
            O = o / l[:, None]
        with np.errstate(divide="ignore"):
            lse = {"m": m, "log l": np.log(l), "o": shift + np.log(l)}.get(
                lse_rule, shift + np.log(l)
            )
        if lse_rule == "o":
            O = o
        return O, lse

    return fn


def step_with_library(Q, P_q, K, V, P_k, causal):
    mask = P_k <= P_q[:, None] if causal else None
    return flashref.tiled_attention(Q, K, V, mask=mask, return_lse=True)


def test_device_step_accepts_correct_solutions():
    result = check_device_step(step())
    assert result, str(result)
    assert result.cases_run >= 10
    assert check_device_step(step_with_library)


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (step(mask="local"), rm.LOCAL_MASK),
        (step(mask="strict"), rm.STRICT_MASK),
        (step(mask="flipped"), rm.FLIPPED_MASK),
        (step(mask="none"), rm.NO_MASK),
        (step(scaled=False), rm.NO_SCALE),
        (step(lse_rule="log l"), rm.LSE_NO_MAX),
        (step(lse_rule="m"), rm.LSE_IS_M),
        (step(lse_rule="o"), rm.UNNORMALISED),
        (step(guard=False), rm.EMPTY_NAN),
        (step(fill=-1e9), rm.FINITE_FILL),
        (step(fill=np.finfo(np.float64).min), rm.FINITE_FILL),
        (step(lse_rule="no shift"), rm.NO_SHIFT),
    ],
    ids=[
        "local",
        "strict",
        "flipped",
        "no_mask",
        "no_scale",
        "lse_no_max",
        "lse_is_m",
        "unnormalised",
        "empty_nan",
        "fill_1e9",
        "fill_min",
        "no_shift",
    ],
)
def test_device_step_names_planted_mistake(fn, name):
    with np.errstate(all="ignore"):  # several planted mistakes divide 0 by 0, on purpose
        result = check_device_step(fn)
    text = flat(result)
    assert not result
    assert f"likely mistake: {name}" in text, text
    assert "P_q " in text and "causal=" in text and "expected" in text
    diagnosed = [f.diagnosis for f in result.failures if f.diagnosis]
    assert diagnosed and all(d == name for d in diagnosed), diagnosed


def test_device_step_float32_is_a_precision_problem():
    result = check_device_step(step(dtype=np.float32))
    assert not result
    assert all(f.case.startswith("scores near 1000") for f in result.failures), str(result)
    assert all(f.diagnosis == PRECISION for f in result.failures), str(result)


def test_device_step_says_when_a_row_sees_no_key():
    result = check_device_step(step(mask="local"))
    assert "row 0 sees no key of the block; tolerance 1e-05 x max|V|" in str(result)


def test_device_step_nan_never_passes():
    def one_nan(*args):
        O, lse = step()(*args)
        O[-1, 0] = np.nan
        return O, lse

    def nan_lse(*args):
        O, lse = step()(*args)
        return O, np.full_like(lse, np.nan)

    for fn in (one_nan, nan_lse):
        result = check_device_step(fn)
        assert not result and len(result.failures) == result.cases_run
        assert "got nan" in str(result)


@pytest.mark.parametrize(
    ("transform", "says"),
    [
        (lambda out: out[0], "expected (O, lse), got one array: the lse is what lets"),
        (lambda out: list(out), "expected a tuple (O, lse), got list"),
        (lambda out: (*out, 0.0), "expected a tuple (O, lse), got a tuple of 3 values"),
        (lambda out: (out[0].tolist(), out[1]), "O: expected a numpy array, got a list"),
        (lambda out: (out[0], out[1][None]), "lse: expected shape (8,), got shape (1, 8)"),
        (lambda out: (np.ma.masked_array(out[0]), out[1]), "O: expected a plain numpy array"),
        (lambda out: (out[0], out[1].astype(int)), "lse: expected a float array, got dtype"),
        (lambda out: None, "the function returned None"),
    ],
    ids=["one", "list", "triple", "O_list", "lse_shape", "masked", "lse_int", "none"],
)
def test_device_step_answer_rules(transform, says):
    with np.errstate(invalid="ignore"):  # -inf to int
        result = check_device_step(lambda *args: transform(step()(*args)))
    assert not result and len(result.failures) == result.cases_run
    assert says in str(result), str(result)


# --- the rules every checker follows --------------------------------------------------------

CHECKERS = {
    "held_positions": (check_held_positions, held()),
    "zigzag_positions": (check_zigzag_positions, zigzag()),
    "device_step": (check_device_step, step()),
}
POSITIONS = ["held_positions", "zigzag_positions"]


@pytest.mark.parametrize(
    ("transform", "says"),
    [
        (lambda P: None, "the function returned None (is a `return` missing?)"),
        (lambda P: P.tolist(), "expected a numpy array, got a list"),
        (lambda P: (P, P), "expected one array of positions, got a tuple of 2 values"),
        (lambda P: P.astype(float), "expected an integer array (positions index the sequence)"),
        (lambda P: np.ma.masked_all(P.shape, dtype=int), "got a numpy.ma.MaskedArray"),
        (lambda P: P[:-1], "positions, shape ("),
        (lambda P: int(P[0]), "expected a numpy array, got int"),
    ],
    ids=["none", "list", "tuple", "float", "masked", "short", "int"],
)
@pytest.mark.parametrize("name", POSITIONS)
def test_positions_answer_rules(name, transform, says):
    checker, correct = CHECKERS[name]
    result = checker(lambda *args: transform(correct(*args)))
    assert not result and len(result.failures) == result.cases_run
    assert says in str(result), str(result)


@pytest.mark.parametrize("name", CHECKERS)
@pytest.mark.parametrize("fn", [np.zeros(3), "my_function", None])
def test_a_non_callable_fn_is_a_type_error_up_front(name, fn):
    checker, _ = CHECKERS[name]
    with pytest.raises(TypeError, match=r"^fn must be a function \(fn\(.*\), got "):
        checker(fn)


@pytest.mark.parametrize("name", CHECKERS)
def test_not_implemented_everywhere_reads_as_one_line(name):
    checker, _ = CHECKERS[name]

    def todo(*args):
        raise NotImplementedError("your code here")

    result = checker(todo)
    assert not result and result.failures[0].problem == NOT_IMPLEMENTED
    assert str(result) == (
        f"check_{name}: not implemented yet "
        f"(all {result.cases_run} cases raised NotImplementedError)"
    )


@pytest.mark.parametrize("name", CHECKERS)
def test_an_exception_is_reported_and_the_other_cases_run(name):
    checker, correct = CHECKERS[name]
    calls = []

    def flaky(*args):
        calls.append(None)
        if len(calls) == 2:
            raise IndexError("block out of range")
        return correct(*args)

    result = checker(flaky)
    assert len(result.failures) == 1 and len(calls) == result.cases_run
    assert "raised IndexError: block out of range" in str(result)


@pytest.mark.parametrize("name", CHECKERS)
def test_warnings_in_a_correct_solution_do_not_fail_it(name):
    checker, correct = CHECKERS[name]

    def warns(*args):
        np.log(np.zeros(1))  # RuntimeWarning: divide by zero encountered in log
        return correct(*args)

    old = np.seterr(all="raise")
    try:
        result = checker(warns)
    finally:
        np.seterr(**old)
    assert result, str(result)
    assert "note: the function warned in" in str(result)


def test_dir_lists_the_ring_checkers():
    listed = dir(flashref.exercises)
    for name in CHECKERS:
        assert f"check_{name}" in listed


def test_report_lines_fit_the_books_width():
    # Every case label and problem line (the warnings a reader's code raised are its own).
    with np.errstate(all="ignore"):
        results = [
            check_held_positions(held(block_of=lambda W, s, r: (r + s) % W)),
            check_held_positions(held(layout_of=lambda layout: "contiguous")),
            check_zigzag_positions(lambda N, W, r: np.arange(r, N, W)),
            check_device_step(step(mask="none")),
            check_device_step(step(lse_rule="no shift")),
        ]
    for result in results:
        failures = result.failures
        for start in range(0, len(failures), 5):  # a report lists five: print each five
            result.failures = failures[start : start + 5]
            lines = str(result).splitlines()
            lines = [line for line in lines if not line.startswith("  warned:")]
            assert max(map(len, lines)) <= 79, str(result)
