"""The six exercise checkers follow one set of rules, and never crash or pass a wrong answer.

Each test plants the same kind of wrong answer in every checker: a masked array, a
list, a tuple (O, lse), None, an object NumPy cannot convert, a function that warns
or raises in one branch. The correct solutions are flashref's own functions, so
these tests are about the rules, not the arithmetic (the chapter tests cover that).
"""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest
from reference import no_warnings

import flashref
import flashref.exercises
from flashref.exercises import (
    check_merge_states,
    check_one_query_attention,
    check_online_softmax,
    check_safe_softmax,
    check_streaming_weighted_sum,
    check_tiled_attention,
)


def one_query(q, K, V, tile_size):
    return flashref.tiled_attention(q[None], K, V, block_k=tile_size)[0]


def tiled(q, k, v, block_q, block_k, causal):
    return flashref.tiled_attention(q, k, v, block_q=block_q, block_k=block_k, causal=causal)


# name -> (checker, a correct solution)
CHECKERS = {
    "safe_softmax": (check_safe_softmax, flashref.safe_softmax),
    "online_softmax": (check_online_softmax, flashref.online_softmax),
    "streaming_weighted_sum": (check_streaming_weighted_sum, flashref.streaming_weighted_sum),
    "merge_states": (check_merge_states, flashref.merge_states),
    "one_query_attention": (check_one_query_attention, one_query),
    "tiled_attention": (check_tiled_attention, tiled),
}
ARRAY_CHECKERS = ["safe_softmax", "online_softmax", "one_query_attention", "tiled_attention"]


def returning(name, transform):
    """The correct solution of checker ``name`` with its answer passed through ``transform``."""
    _, correct = CHECKERS[name]
    return lambda *args: transform(correct(*args))


def as_state(make_part):
    """A transform for merge answers: an object with .m and .l made by ``make_part``."""
    return lambda s: types.SimpleNamespace(m=make_part(s.m), l=make_part(s.l), o=None)


class Unconvertible:
    """Like a torch tensor that requires grad: NumPy's conversion raises."""

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach()")

    def __float__(self):
        raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach()")


@pytest.fixture(autouse=True)
def every_warning_is_an_error():
    """A checker must not warn on its own, whatever it is given (as under python -W error)."""
    with no_warnings():
        yield


@pytest.mark.parametrize("name", CHECKERS)
def test_each_correct_solution_passes(name):
    checker, correct = CHECKERS[name]
    result = checker(correct)
    assert result, str(result)
    assert "passed" in str(result) and not result.notes


# --- what an answer may be ------------------------------------------------------------------


@pytest.mark.parametrize("name", ARRAY_CHECKERS)
@pytest.mark.parametrize(
    "transform",
    [
        lambda o: np.ma.masked_all(o.shape),  # every element masked: nothing left to compare
        lambda o: np.ma.divide(o, np.zeros_like(o)),  # masked where divided by 0: all of it
        lambda o: np.ma.masked_array(o),  # right values, no mask: still not a plain array
    ],
    ids=["fully_masked", "ma_divide", "unmasked"],
)
def test_a_masked_array_never_passes(name, transform):
    checker, _ = CHECKERS[name]
    result = checker(returning(name, transform))
    text = str(result)
    assert not result and len(result.failures) == result.cases_run
    assert "numpy.ma.MaskedArray" in text and "got --" not in text


def test_a_masked_state_never_passes():
    result = check_merge_states(returning("merge_states", as_state(np.ma.masked_all_like)))
    assert not result and len(result.failures) == result.cases_run
    assert "m: " in str(result) and "numpy.ma.MaskedArray" in str(result)


@pytest.mark.parametrize("name", ["safe_softmax", "online_softmax", "tiled_attention"])
def test_a_matrix_is_refused(name):
    checker, _ = CHECKERS[name]
    result = checker(returning(name, lambda o: np.asmatrix(np.atleast_2d(o))))
    assert not result and len(result.failures) == result.cases_run
    assert "got a numpy.matrix (an ndarray subclass)" in str(result)


@pytest.mark.parametrize("name", ARRAY_CHECKERS)
def test_a_list_is_refused_by_every_array_checker(name):
    checker, _ = CHECKERS[name]
    result = checker(returning(name, lambda o: o.tolist()))
    assert not result and len(result.failures) == result.cases_run
    assert "expected a numpy array, got a list" in str(result)


def test_a_list_is_refused_for_a_float_and_for_a_state():
    result = check_streaming_weighted_sum(returning("streaming_weighted_sum", lambda x: [x]))
    assert not result and "expected a float, got list" in str(result)
    result = check_merge_states(returning("merge_states", as_state(lambda a: a.tolist())))
    assert not result and "m: expected a numpy array, got a list" in str(result)


@pytest.mark.parametrize("name", ARRAY_CHECKERS)
def test_a_tuple_o_lse_gets_a_hint(name):
    checker, _ = CHECKERS[name]
    result = checker(returning(name, lambda o: (o, np.zeros(o.shape[:-1]))))
    assert not result and len(result.failures) == result.cases_run
    assert "got a tuple of 2 values: return" in str(result) and ", lse)" in str(result)


def test_a_tuple_gets_a_hint_for_a_float_and_for_a_state():
    result = check_streaming_weighted_sum(returning("streaming_weighted_sum", lambda x: (x, 0.0)))
    assert "expected one float (o / l), got a tuple of 2 values" in str(result)
    result = check_merge_states(returning("merge_states", lambda s: (s.m, s.l)))
    assert "got tuple of 2 values (return SoftmaxState(m, l), not (m, l))" in str(result)


@pytest.mark.parametrize("name", CHECKERS)
def test_a_forgotten_return_is_named(name):
    checker, _ = CHECKERS[name]
    result = checker(returning(name, lambda out: None))
    assert not result and len(result.failures) == result.cases_run
    assert "the function returned None (is a `return` missing?)" in str(result)
    assert "got nan" not in str(result)


@pytest.mark.parametrize("name", CHECKERS)
def test_an_answer_numpy_cannot_convert_is_a_report_line(name):
    checker, _ = CHECKERS[name]
    result = checker(returning(name, lambda out: Unconvertible()))
    assert not result and len(result.failures) == result.cases_run
    assert "Unconvertible" in str(result)


def test_a_state_holding_an_unconvertible_part_is_a_report_line():
    result = check_merge_states(returning("merge_states", as_state(lambda a: Unconvertible())))
    assert not result and "m: expected a numpy array, got" in str(result)


@pytest.mark.parametrize(
    ("transform", "says"),
    [
        (lambda x: complex(x, 1e-3), "expected a real float, got complex"),
        (lambda x: complex(x, 0.0), "expected a real float, got complex"),  # exact real part
        (lambda x: np.complex128(x), "expected a real float, got numpy.complex128"),
        (lambda x: str(x), "expected a float, got the string '30.0"),
        (lambda x: "30.0", "expected a float, got the string '30.0'"),
        (lambda x: np.array([x]), "expected a single float, got an array of shape (1,)"),
        (lambda x: np.str_(x), "got the string"),
    ],
)
def test_streaming_weighted_sum_wants_a_real_float(transform, says):
    result = check_streaming_weighted_sum(returning("streaming_weighted_sum", transform))
    assert not result and len(result.failures) == result.cases_run
    assert says in str(result)


@pytest.mark.parametrize(
    "transform",
    [float, np.float64, np.array, lambda x: np.float32(x).item()],
    ids=["float", "np.float64", "0-d array", "float32 value as a float"],
)
def test_streaming_weighted_sum_accepts_any_real_float_form(transform):
    result = check_streaming_weighted_sum(returning("streaming_weighted_sum", transform))
    if transform in (float, np.float64, np.array):
        assert result, str(result)
    else:  # a float holding a float32 value is not as close as float64 gets
        assert not result and "float32 precision" in str(result)


# --- fn, exceptions and warnings: the same rule in every checker ------------------------------


@pytest.mark.parametrize("name", CHECKERS)
@pytest.mark.parametrize("fn", [np.zeros(3), "my_function", None])
def test_a_non_callable_fn_is_a_type_error_up_front(name, fn):
    checker, _ = CHECKERS[name]
    with pytest.raises(TypeError, match=r"^fn must be a function \(fn\(.*\), got "):
        checker(fn)


def test_check_merge_states_wants_a_bool_with_o():
    with pytest.raises(TypeError, match="with_o must be True or False, got 'yes'"):
        check_merge_states(flashref.merge_states, with_o="yes")


@pytest.mark.parametrize("name", CHECKERS)
def test_not_implemented_in_one_branch_still_runs_the_other_cases(name):
    checker, correct = CHECKERS[name]
    calls = []

    def half_done(*args):
        calls.append(None)
        if len(calls) % 2 == 0:
            raise NotImplementedError("the ragged tail")
        return correct(*args)

    result = checker(half_done)
    assert len(calls) == result.cases_run > 2
    assert len(result.failures) == result.cases_run // 2
    assert all(f.problem == "not implemented yet" for f in result.failures)
    assert f"{result.cases_run // 2} of {result.cases_run} cases failed" in str(result)


@pytest.mark.parametrize("name", CHECKERS)
def test_not_implemented_everywhere_reads_as_one_line(name):
    checker, _ = CHECKERS[name]

    def todo(*args):
        raise NotImplementedError("your code here")

    result = checker(todo)
    assert not result and result.cases_run == len(result.failures) > 1
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
            raise IndexError("tile out of range")
        return correct(*args)

    result = checker(flaky)
    assert len(result.failures) == 1 and len(calls) == result.cases_run
    assert "raised IndexError: tile out of range" in str(result)


@pytest.mark.parametrize("name", CHECKERS)
def test_warnings_in_a_correct_solution_do_not_fail_it(name):
    """Under -W error and np.seterr(all="raise") a correct answer that warns still passes."""
    checker, correct = CHECKERS[name]

    def warns(*args):
        np.log(np.zeros(1))  # RuntimeWarning: divide by zero encountered in log
        warnings.warn("a note to self", UserWarning, stacklevel=1)
        return correct(*args)

    old = np.seterr(all="raise")
    try:
        result = checker(warns)
    finally:
        np.seterr(**old)
    assert result, str(result)
    assert str(result).startswith(f"check_{name}: all {result.cases_run} cases passed\nnote: ")
    assert "divide by zero encountered in log; UserWarning: a note to self" in str(result)


@pytest.mark.parametrize("name", ARRAY_CHECKERS)
def test_warnings_of_a_failing_case_are_listed_with_it(name):
    checker, _ = CHECKERS[name]
    result = checker(returning(name, lambda o: o / np.zeros_like(o)))  # inf or nan everywhere
    assert not result
    assert "warned: " in str(result) and "encountered in divide" in str(result)


def test_dir_lists_the_checkers():
    listed = dir(flashref.exercises)
    for name in CHECKERS:
        assert f"check_{name}" in listed
    assert "CheckResult" in listed


def test_report_lines_of_a_diagnosis_fit_the_books_width():
    def naive_softmax_online(x, block_size):
        return flashref.naive_softmax(x)

    for result in (
        check_safe_softmax(flashref.naive_softmax),
        check_online_softmax(naive_softmax_online),
        check_tiled_attention(
            lambda q, k, v, bq, bk, c: flashref.naive_attention(q, k, v, causal=c)
        ),
    ):
        diagnosis_lines = [
            line for line in str(result).splitlines() if line.startswith(("  likely", "    "))
        ]
        assert diagnosis_lines and max(map(len, diagnosis_lines)) <= 79, str(result)


def test_an_all_nan_placeholder_is_not_implemented_not_a_mistake():
    """np.full(shape, np.nan) in every case is a placeholder: the report says so, names no
    likely mistake, and a real attempt that is NaN only where it goes wrong is still named."""
    import numpy as np

    from flashref.exercises import check_device_step, check_tiled_attention, check_tiled_backward
    from flashref.exercises._report import ALL_NAN

    def backward(q, k, v, o, lse, do, block_q, block_k, causal):
        return np.full(q.shape, np.nan), np.full(k.shape, np.nan), np.full(v.shape, np.nan)

    def step(Q, P_q, K, V, P_k, causal):
        return np.full((len(Q), V.shape[1]), np.nan), np.full(len(Q), np.nan)

    def forward(q, k, v, block_q, block_k, causal):
        return np.full((len(q), v.shape[1]), np.nan)

    for checker, fn in ((check_tiled_backward, backward), (check_device_step, step)):
        result = checker(fn)
        assert not result and all(
            f.problem == ALL_NAN and f.diagnosis is None for f in result.failures
        ), str(result)
        assert str(result).endswith(f"all {result.cases_run} cases returned only NaN)")
        assert "likely mistake" not in str(result)
    # rescaling the wrong way overflows in every case: NaN everywhere has a mistake that
    # explains it, which is named, and the report says that a placeholder looks the same
    result = check_tiled_attention(forward)
    assert "likely mistake: " in str(result)
    assert str(result).endswith(
        "note: every value of every case is NaN, as a placeholder answer's would be"
    )
