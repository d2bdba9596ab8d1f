"""The Hopper chapters' checkers: right answers pass, planted mistakes are named.

The right solutions are written the way a reader might, from the chapter's rules, not
through ``flashref.hardware.hopper``; each planted solution is one with a single
mistake, and the checker must fail it and name that mistake on every case it names
anything. The barrier and wait_group checkers must also say what the wrong wait does.
"""

from __future__ import annotations

import numpy as np
import pytest
from exercise_report import assert_named, flat
from reference import no_warnings

import flashref.exercises
from flashref.exercises import _hopper_mistakes as hm
from flashref.exercises import (
    check_producer_wait,
    check_ring_parity,
    check_swizzle_offset,
    check_wait_group,
    check_wgmma_accumulator,
)
from flashref.exercises._report import NOT_IMPLEMENTED


@pytest.fixture(autouse=True)
def every_warning_is_an_error():
    """A checker must not warn on its own, whatever it is given (as under python -W error)."""
    with no_warnings():
        yield


# --- the wgmma accumulator ---------------------------------------------------------------------


def accumulator(warp_rows=True, g_in_warp=True, upper_first=True, regs_per_block=4, paired=True):
    """The accumulator map from the chapter's rule, with one planted mistake by argument."""

    def fn(thread, reg, n):
        w, lane = thread // 32, thread % 32
        g = lane // 4 if g_in_warp else thread // 4
        t = lane % 4
        row = g + (8 if (reg % 4 >= 2) == upper_first else 0)
        if warp_rows and g_in_warp:
            row += 16 * w
        j = reg // regs_per_block
        col = 8 * j + (2 * t + reg % 2 if paired else t + 4 * (reg % 2))
        return row, col

    return fn


def test_the_accumulator_map_passes():
    result = check_wgmma_accumulator(accumulator())
    assert result, str(result)
    assert result.cases_run == 2


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"warp_rows": False}, hm.NO_WARP_OFFSET),
        ({"g_in_warp": False}, hm.G_OVER_WARPGROUP),
        ({"upper_first": False}, hm.HALVES_SWAPPED),
        ({"regs_per_block": 2}, hm.BLOCK_PER_PAIR),
        ({"paired": False}, hm.COLUMN_NOT_PAIRED),
    ],
)
def test_accumulator_mistakes_are_named(kwargs, name):
    assert_named(check_wgmma_accumulator(accumulator(**kwargs)), name)


def test_an_accumulator_answer_in_numpy_ints_passes_and_a_float_is_refused():
    right = accumulator()
    assert check_wgmma_accumulator(lambda *a: tuple(np.int64(x) for x in right(*a)))
    result = check_wgmma_accumulator(lambda *a: (float(right(*a)[0]), right(*a)[1]))
    assert not result and "a pair of ints, got tuple" in flat(result)


# --- the 128-byte swizzle ----------------------------------------------------------------------


def swizzle(xor_rows=8, xor_what="chunk", element_bytes=2):
    """The swizzled byte offset, written from the chapter's rule, with one planted mistake."""

    def fn(r, c):
        if xor_what == "none":
            return r * 128 + 2 * c
        if xor_what == "element":
            return r * 128 + 2 * (c ^ (r % xor_rows))
        key = r if xor_rows is None else r % xor_rows
        return r * 128 + ((c // 8) ^ key) * 16 + element_bytes * (c % 8)

    return fn


def test_the_swizzle_passes():
    assert check_swizzle_offset(swizzle())


def test_the_swizzle_as_the_hardware_applies_it_passes():
    def on_address(r, c):  # the linear address, then bits 4-6 ^= bits 7-9
        a = r * 128 + 2 * c
        return a ^ (((a >> 7) & 7) << 4)

    assert check_swizzle_offset(on_address)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"xor_what": "none"}, hm.NO_SWIZZLE),
        ({"xor_what": "element"}, hm.ELEMENT_XOR),
        ({"xor_rows": None}, hm.ROW_NOT_MOD_8),
        ({"xor_rows": 4}, hm.SWIZZLE_64),
        ({"element_bytes": 1}, hm.ONE_BYTE_ELEMENTS),
    ],
)
def test_swizzle_mistakes_are_named(kwargs, name):
    assert_named(check_swizzle_offset(swizzle(**kwargs)), name)


def test_the_mod_8_mistake_passes_the_first_eight_rows_only():
    result = check_swizzle_offset(swizzle(xor_rows=None))
    assert [f.case for f in result.failures] == [
        "rows 8-15, columns 0-63",
        "rows 16-63, columns 0-63",
    ]


# --- the consumers' wait -----------------------------------------------------------------------


def test_the_ring_parity_passes():
    def fn(t, stages):
        use = t // stages  # this buffer's use
        return t % stages, use % 2

    assert check_ring_parity(fn)


@pytest.mark.parametrize(
    "fn, name",
    [
        (lambda t, S: (t % S, t % 2), hm.PARITY_OF_TILE),
        (lambda t, S: (t % S, 0), hm.PARITY_ZERO),
        (lambda t, S: (t % S, t // S), hm.USE_NOT_PARITY),
        (lambda t, S: (t % 2, t // 2 % 2), hm.TWO_BUFFER_RULE),
        (lambda t, S: (t % S, t % S % 2), hm.BUFFER_PARITY),
    ],
)
def test_ring_parity_mistakes_are_named(fn, name):
    assert_named(check_ring_parity(fn), name)


# --- the producer's wait -----------------------------------------------------------------------


def test_the_producer_wait_passes():
    def fn(t, stages):
        use = t // stages
        return t % stages, (use - 1) % 2  # use 0: parity 1, which a fresh barrier passes

    assert check_producer_wait(fn)


def test_the_consumers_parity_for_the_producer_hangs_at_the_first_tile():
    result = check_producer_wait(lambda t, S: (t % S, t // S % 2))
    assert_named(result, hm.CONSUMER_PARITY)
    assert "the kernel hangs" in flat(result)


def test_a_producer_that_never_waits_the_first_time_overwrites_later():
    # the first use right (parity 1), the later ones with the consumers' parity
    result = check_producer_wait(lambda t, S: (t % S, 1 if t < S else t // S % 2))
    assert not result
    assert "is still being read from stage" in flat(result), flat(result)


@pytest.mark.parametrize(
    "fn, name",
    [
        (lambda t, S: (t % S, (t + 1) % 2), hm.PRODUCER_TILE_PARITY),
        (lambda t, S: (t % S, 0), hm.PRODUCER_ZERO),
        (lambda t, S: ((t - 1) % S, (t // S + 1) % 2), hm.PRODUCER_PREVIOUS_STAGE),
    ],
)
def test_producer_mistakes_are_named(fn, name):
    assert_named(check_producer_wait(fn), name)


# --- wait_group --------------------------------------------------------------------------------


def test_the_wait_group_count_passes():
    def fn(groups, needed):
        return len(groups) - 1 - groups.index(needed)  # the groups committed after it

    assert check_wait_group(fn)


@pytest.mark.parametrize(
    "fn, name, effect",
    [
        (lambda g, n: g.index(n), hm.COUNTED_FROM_FIRST, "still running"),
        (lambda g, n: len(g) - g.index(n), hm.ONE_TOO_MANY, "while the tensor cores write"),
        (lambda g, n: 0, hm.WAIT_ALL, "which the read does not need"),
    ],
)
def test_wait_group_mistakes_are_named_with_what_they_do(fn, name, effect):
    result = check_wait_group(fn)
    assert_named(result, name)
    assert effect in flat(result)


# --- the rules every checker keeps -------------------------------------------------------------

CHECKERS = {
    "check_wgmma_accumulator": (check_wgmma_accumulator, 3),
    "check_swizzle_offset": (check_swizzle_offset, 2),
    "check_ring_parity": (check_ring_parity, 2),
    "check_producer_wait": (check_producer_wait, 2),
    "check_wait_group": (check_wait_group, 2),
}


@pytest.mark.parametrize("name", CHECKERS)
def test_checkers_are_exported(name):
    assert getattr(flashref.exercises, name) is CHECKERS[name][0]
    assert name in dir(flashref.exercises)


@pytest.mark.parametrize("name", CHECKERS)
def test_not_implemented_none_and_errors_are_reported(name):
    check, _ = CHECKERS[name]

    def todo(*args):
        raise NotImplementedError

    assert NOT_IMPLEMENTED in str(check(todo))
    assert "return` missing" in str(check(lambda *args: None))
    broken = check(lambda *args: 1 // 0)
    assert not broken and "raised ZeroDivisionError" in str(broken)
    with pytest.raises(TypeError, match="fn must be a function"):
        check("not a function")


def test_the_learners_function_gets_its_own_groups():
    """A function that changes the list it is given (pops from it, reverses it) changes
    neither the checker's expected answers nor its report."""

    def right_then_pops(groups, needed):
        answer = len(groups) - 1 - groups.index(needed)
        groups.clear()  # the checker's candidates read the list after this call
        return answer

    assert check_wait_group(right_then_pops)

    def wrong_and_reverses(groups, needed):
        groups.reverse()
        return 0

    assert str(check_wait_group(wrong_and_reverses)) == str(check_wait_group(lambda g, n: 0))
