"""The inference chapter's checkers: right answers pass, planted mistakes are named.

Each planted solution below is the code a reader might write with one mistake in it;
the checker must fail it and name that mistake on every case it names anything.
"""

from __future__ import annotations

import numpy as np
import pytest
from exercise_report import assert_named
from reference import no_warnings

import flashref
import flashref.exercises
from flashref.exercises import _decode_mistakes as dm
from flashref.exercises import check_combine_splits, check_gqa_heads, check_paged_gather
from flashref.exercises._report import NOT_IMPLEMENTED, PRECISION


@pytest.fixture(autouse=True)
def every_warning_is_an_error():
    """A checker must not warn on its own, whatever it is given (as under python -W error)."""
    with no_warnings():
        yield


# --- the combine step -------------------------------------------------------------------------


def combine(shift_max=True, weights="exp", guard=True, normalise=True, lse_rule="m + log"):
    """The combine step in NumPy, with one planted mistake chosen by the arguments."""

    def fn(O_s, lse_s):  # (S, R, dv), (S, R)
        m = lse_s.max(axis=0)  # (R,)
        seen = np.isfinite(m)
        shift = np.where(seen, m, 0.0) if guard else m
        if not shift_max:
            shift = np.zeros_like(m)
        w = {
            "exp": lambda: np.exp(lse_s - shift),
            "lse": lambda: np.where(np.isfinite(lse_s), lse_s, 0.0),
            "equal": lambda: np.ones_like(lse_s),
        }[weights]()  # (S, R)
        total = w.sum(axis=0)  # (R,)
        O = (w[..., None] * O_s).sum(axis=0)  # (R, dv)
        if normalise and guard and shift_max:
            O = np.divide(O, total[:, None], out=np.zeros_like(O), where=total[:, None] > 0)
        elif normalise:
            O = O / total[:, None]
        with np.errstate(divide="ignore"):
            lse = {"m + log": shift + np.log(total), "log": np.log(total), "m": m}[lse_rule]
        if weights != "exp":
            lse = np.where(seen, np.logaddexp.reduce(lse_s, axis=0), -np.inf)
        return O, lse

    return fn


def combine_with_library(O_s, lse_s):
    states = [flashref.SoftmaxState.from_output(O, lse) for O, lse in zip(O_s, lse_s, strict=True)]
    state = states[0]
    for other in states[1:]:
        state = flashref.merge_states(state, other)
    return state.result(), state.lse()


def test_combine_accepts_correct_solutions():
    result = check_combine_splits(combine())
    assert result, str(result)
    assert result.cases_run >= 9 and str(result).endswith("cases passed")
    assert check_combine_splits(combine_with_library)


def test_combine_cases_are_the_splits_of_naive_attention():
    # the cases built from split_kv_attention merge into naive attention's output
    from flashref.exercises.decode import _combine_cases

    cases = _combine_cases()
    assert sum(np.isneginf(lse_s).all(axis=0).any() for _, _, lse_s in cases) >= 1
    assert sum(np.isneginf(lse_s).any() for _, _, lse_s in cases) >= 3
    for _, O_s, lse_s in cases:
        O, lse = dm.combine_reference(O_s, lse_s)
        assert np.isfinite(O).all() and not np.isnan(lse).any()


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (combine(shift_max=False), dm.NO_MAX),
        (combine(weights="lse"), dm.LSE_WEIGHTS),
        (combine(weights="equal"), dm.AVERAGE),
        (combine(guard=False), dm.EMPTY_NAN),
        (combine(normalise=False), dm.UNNORMALISED),
        (combine(lse_rule="log"), dm.LSE_NO_MAX),
        (combine(lse_rule="m"), dm.LSE_IS_MAX),
    ],
    ids=["no_max", "lse_weights", "average", "empty_nan", "unnormalised", "lse_no_max", "lse_m"],
)
def test_combine_names_planted_mistake(fn, name):
    with np.errstate(all="ignore"):  # several planted mistakes divide 0 by 0, on purpose
        result = check_combine_splits(fn)
    assert_named(result, name)
    assert "O_s (" in str(result) and "expected" in str(result)


def test_combine_float32_is_a_precision_problem():
    def in_float32(O_s, lse_s):
        O, lse = combine()(O_s.astype(np.float32), lse_s.astype(np.float32))
        return O.astype(np.float64), lse.astype(np.float64)

    result = check_combine_splits(in_float32)
    assert not result
    assert all(f.case.startswith("lse near") for f in result.failures), str(result)
    assert all(f.diagnosis == PRECISION for f in result.failures), str(result)


def test_combine_says_which_splits_are_empty():
    with np.errstate(all="ignore"):
        result = check_combine_splits(combine(guard=False))
    assert "all 4 splits of row 1 are empty" in str(result), str(result)


def test_combine_nan_never_passes():
    def one_nan(O_s, lse_s):
        O, lse = combine()(O_s, lse_s)
        O[-1, 0] = np.nan
        return O, lse

    def nan_lse(O_s, lse_s):
        O, lse = combine()(O_s, lse_s)
        return O, np.full_like(lse, np.nan)

    for fn in (one_nan, nan_lse):
        result = check_combine_splits(fn)
        assert not result and len(result.failures) == result.cases_run
        assert "got nan" in str(result)


@pytest.mark.parametrize(
    ("transform", "says"),
    [
        (lambda out: out[0], "expected (O, lse), got one array: the merged lse"),
        (lambda out: list(out), "expected a tuple (O, lse), got list"),
        (lambda out: (*out, 0.0), "expected a tuple (O, lse), got a tuple of 3 values"),
        (lambda out: (out[0].tolist(), out[1]), "O: expected a numpy array, got a list"),
        (lambda out: (out[0], out[1][None]), "lse: expected shape ("),
        (lambda out: (out[0].T, out[1]), "O: expected shape ("),
        (lambda out: None, "the function returned None"),
    ],
    ids=["one", "list", "triple", "O_list", "lse_shape", "O_transposed", "none"],
)
def test_combine_answer_rules(transform, says):
    result = check_combine_splits(lambda *args: transform(combine()(*args)))
    assert not result and len(result.failures) == result.cases_run
    assert says in str(result), str(result)


# --- the GQA head mapping -----------------------------------------------------------------


def test_gqa_heads_accepts_correct_solutions():
    for fn in (
        lambda Hq, Hkv: np.arange(Hq) // (Hq // Hkv),
        lambda Hq, Hkv: np.arange(Hq) * Hkv // Hq,  # the same for Hq a multiple of Hkv
        lambda Hq, Hkv: np.repeat(np.arange(Hkv), Hq // Hkv),
    ):
        result = check_gqa_heads(fn)
        assert result, str(result)
        assert result.cases_run >= 8


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (lambda Hq, Hkv: np.arange(Hq) % Hkv, dm.MODULO_HKV),
        (lambda Hq, Hkv: np.tile(np.arange(Hkv), Hq // Hkv), dm.MODULO_HKV),
        (lambda Hq, Hkv: np.arange(Hq) % (Hq // Hkv), dm.MODULO_G),
        (lambda Hq, Hkv: np.arange(Hq) // Hkv, dm.DIVIDE_BY_HKV),
        (lambda Hq, Hkv: np.arange(Hq) * Hq // Hkv, dm.DIVIDE_BY_HQ),
    ],
    ids=["modulo_hkv", "tile", "modulo_g", "divide_by_hkv", "divide_by_hq"],
)
def test_gqa_heads_names_planted_mistake(fn, name):
    result = check_gqa_heads(fn)
    assert_named(result, name)
    assert "expected 0 0 " in str(result)


@pytest.mark.parametrize(
    ("transform", "says"),
    [
        (lambda H: H.tolist(), "expected a numpy array, got a list"),
        (lambda H: H.astype(float), "expected an integer array"),
        (lambda H: H[:-1], "expected one K/V head per query head"),
        (lambda H: (H, H), "expected one array of K/V heads, got a tuple of 2 values"),
        (lambda H: None, "the function returned None"),
    ],
    ids=["list", "float", "short", "tuple", "none"],
)
def test_gqa_heads_answer_rules(transform, says):
    result = check_gqa_heads(lambda Hq, Hkv: transform(np.arange(Hq) // (Hq // Hkv)))
    assert not result and len(result.failures) == result.cases_run
    assert says in str(result), str(result)


# --- reading a paged cache ----------------------------------------------------------------------


def gather(pages_of=lambda table, n: table[:n], length_of=lambda L, n, ps: L, moveaxis=True):
    """Read one sequence's keys page by page, with one planted mistake chosen by rules."""

    def fn(k_pages, block_table, length):
        _, Hkv, ps, d = k_pages.shape
        n = -(-length // ps)  # pages in use
        pages = np.asarray(pages_of(block_table, n), dtype=np.intp)
        got = k_pages[pages]  # (n, Hkv, ps, d)
        if moveaxis:
            got = np.moveaxis(got, 0, 1)  # (Hkv, n, ps, d)
        return got.reshape(Hkv, -1, d)[:, : length_of(length, n, ps)]

    return fn


def gather_by_slots(k_pages, block_table, length):
    ps = k_pages.shape[2]
    t = np.arange(length)  # positions
    return k_pages[block_table[t // ps], :, t % ps].transpose(1, 0, 2)  # (Hkv, L, d)


def test_paged_gather_accepts_correct_solutions():
    result = check_paged_gather(gather())
    assert result, str(result)
    assert result.cases_run >= 8
    assert check_paged_gather(gather_by_slots)


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (gather(length_of=lambda L, n, ps: n * ps), dm.WHOLE_LAST_PAGE),
        (gather(pages_of=lambda table, n: table, length_of=lambda L, n, ps: 99), dm.PADDING_READ),
        (gather(length_of=lambda L, n, ps: L - 1), dm.LENGTH_SHORT),
        (
            gather(pages_of=lambda table, n: table[: n + 1], length_of=lambda L, n, ps: L + 1),
            dm.LENGTH_LONG,
        ),
        (gather(pages_of=lambda table, n: np.sort(table[:n])), dm.PAGE_ORDER),
        (gather(pages_of=lambda table, n: table[:n][::-1]), dm.PAGE_ORDER),
        (gather(pages_of=lambda table, n: np.arange(n)), dm.POOL_ORDER),
        (gather(moveaxis=False), dm.NO_MOVEAXIS),
    ],
    ids=["whole_last_page", "padding", "short", "long", "sorted", "reversed", "pool", "axes"],
)
def test_paged_gather_names_planted_mistake(fn, name):
    result = check_paged_gather(fn)
    assert_named(result, name)
    assert "block_table [" in str(result)


def test_paged_gather_says_where_a_wrong_key_came_from():
    result = check_paged_gather(gather(pages_of=lambda table, n: np.arange(n)))
    first = result.failures[0]
    assert first.case == "length 13, page_size 4, block_table [3, 4, 8, 11]"
    assert first.problem == (
        "head 0, position 0: expected page 3, slot 0 (block_table[0]),\n  got page 0, slot 0"
    )
    too_long = check_paged_gather(gather(length_of=lambda L, n, ps: n * ps)).failures[0]
    assert too_long.problem.startswith("expected 13 keys, shape (2, 13, 3), got 16")


@pytest.mark.parametrize(
    ("transform", "says"),
    [
        (lambda K: K.astype(np.float64), "expected dtype float32 (the pool's: a gather copies)"),
        (lambda K: K[0], "expected shape (Hkv, length, d)"),
        (lambda K: K.tolist(), "expected a numpy array, got a list"),
        (lambda K: (K, K), "expected one array K, got a tuple of 2 values"),
        (lambda K: None, "the function returned None"),
    ],
    ids=["float64", "2d", "list", "tuple", "none"],
)
def test_paged_gather_answer_rules(transform, says):
    result = check_paged_gather(lambda *args: transform(gather()(*args)))
    assert not result and len(result.failures) == result.cases_run
    assert says in str(result), str(result)


# --- the rules every checker follows --------------------------------------------------------

CHECKERS = {
    "combine_splits": (check_combine_splits, combine()),
    "gqa_heads": (check_gqa_heads, lambda Hq, Hkv: np.arange(Hq) // (Hq // Hkv)),
    "paged_gather": (check_paged_gather, gather()),
}


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
            raise IndexError("page out of range")
        return correct(*args)

    result = checker(flaky)
    assert len(result.failures) == 1 and len(calls) == result.cases_run
    assert "raised IndexError: page out of range" in str(result)


@pytest.mark.parametrize("name", CHECKERS)
def test_the_inputs_are_fresh_copies(name):
    checker, correct = CHECKERS[name]

    def vandal(*args):
        out = correct(*args)
        for a in args:
            if isinstance(a, np.ndarray) and a.dtype.kind == "f":
                a[...] = np.nan
        return out

    assert checker(vandal)  # every case gets its own copy of the inputs
    assert checker(correct)


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


def test_dir_lists_the_decode_checkers():
    listed = dir(flashref.exercises)
    for name in CHECKERS:
        assert f"check_{name}" in listed


def test_report_lines_fit_the_books_width():
    with np.errstate(all="ignore"):
        results = [
            check_combine_splits(combine(guard=False)),
            check_combine_splits(combine(shift_max=False)),
            check_gqa_heads(lambda Hq, Hkv: np.arange(Hq) % Hkv),
            check_paged_gather(gather(moveaxis=False)),
            check_paged_gather(gather(length_of=lambda L, n, ps: n * ps)),
        ]
    for result in results:
        failures = result.failures
        for start in range(0, len(failures), 5):  # a report lists five: print each five
            result.failures = failures[start : start + 5]
            lines = str(result).splitlines()
            lines = [line for line in lines if not line.startswith("  warned:")]
            assert max(map(len, lines)) <= 79, str(result)
