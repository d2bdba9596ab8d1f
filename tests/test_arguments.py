"""The argument contract shared by every public NumPy function (test_gpu_nogpu.py checks
that flashref.gpu gives the same answers).

Boolean flags must be bools (Python or NumPy); anything else is a TypeError naming
the flag.
"""

from __future__ import annotations

import numpy as np
import pytest

from flashref import naive_attention, tiled_attention, tiled_attention_kv_outer
from flashref._checks import check_flag

ATTENTION = [naive_attention, tiled_attention, tiled_attention_kv_outer]
by_name = pytest.mark.parametrize("fn", ATTENTION, ids=lambda f: f.__name__)


def qkv(dtype=np.float64, Nq=5, Nk=7, d=4, dv=3, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in ((Nq, d), (Nk, d), (Nk, dv)))


def raises(exc_type, call, *needles):
    """``call()`` raises exactly ``exc_type`` (no subclass) with every needle in its message."""
    with pytest.raises(exc_type) as info:
        call()
    assert type(info.value) is exc_type, type(info.value)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    return str(info.value)


# ---- boolean flags ---------------------------------------------------------------------------

NOT_BOOLS = ["False", "no", None, 0, 1, 1.0, np.int64(1), [True]]


@by_name
@pytest.mark.parametrize("flag", ["causal", "return_lse"])
@pytest.mark.parametrize("bad", NOT_BOOLS, ids=repr)
def test_a_flag_that_is_not_a_bool_is_refused(fn, flag, bad):
    q, k, v = qkv()
    expected = f"{flag} must be a bool, got {type(bad).__name__}"
    raises(TypeError, lambda: fn(q, k, v, **{flag: bad}), expected)


@by_name
def test_numpy_bools_are_bools(fn):
    q, k, v = qkv()
    O, lse = fn(q, k, v, causal=True, return_lse=True)
    O_np, lse_np = fn(q, k, v, causal=np.True_, return_lse=np.True_)
    assert O.tobytes() == O_np.tobytes() and lse.tobytes() == lse_np.tobytes()
    out = fn(q, k, v, causal=np.False_, return_lse=np.False_)
    assert isinstance(out, np.ndarray) and out.tobytes() == fn(q, k, v).tobytes()


def test_check_flag_returns_a_python_bool():
    assert check_flag(np.True_, "causal") is True and check_flag(False, "causal") is False
