"""Every error path of naive_attention_backward and tiled_attention_backward: the exception
type, and a message that names the argument and the shapes or dtypes involved."""

from __future__ import annotations

import numpy as np
import pytest
from reference import causal_refusal

from flashref import naive_attention_backward, tiled_attention_backward

BOTH = [naive_attention_backward, tiled_attention_backward]
by_name = pytest.mark.parametrize("fn", BOTH, ids=lambda f: f.__name__)


def expect(exc_type, call, *needles):
    """``call()`` raises ``exc_type`` whose message contains every one of ``needles``."""
    with pytest.raises(exc_type) as info:
        call()
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in message {message!r}"


def zeros(batch=(2, 3), Nq=4, Nk=5, d=8, dv=6):
    """q, k, v, o, lse, do of consistent shapes."""
    shapes = dict(
        q=batch + (Nq, d),
        k=batch + (Nk, d),
        v=batch + (Nk, dv),
        o=batch + (Nq, dv),
        lse=batch + (Nq,),
        do=batch + (Nq, dv),
    )
    return {name: np.zeros(shape) for name, shape in shapes.items()}


@by_name
@pytest.mark.parametrize("which", ["q", "k", "v", "o", "lse", "do"])
@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.complex128, np.object_])
def test_non_float_arrays(fn, which, dtype):
    args = zeros()
    args[which] = args[which].astype(dtype)
    expect(TypeError, lambda: fn(**args), f"{which} has dtype {np.dtype(dtype)}", "float16")


@by_name
@pytest.mark.parametrize("which", ["o", "do"])
@pytest.mark.parametrize(
    "shape", [(2, 3, 4, 5), (2, 3, 3, 6), (2, 2, 4, 6), (3, 4, 6), (2, 3, 4, 6, 1), (6,)]
)
def test_o_and_do_of_the_wrong_shape(fn, which, shape):
    args = zeros()
    args[which] = np.zeros(shape)
    expect(
        ValueError,
        lambda: fn(**args),
        f"{which} has shape {shape}",
        "expected (2, 3, 4, 6) (..., Nq, dv)",
        "q (2, 3, 4, 8)",
        "v (2, 3, 5, 6)",
    )


@by_name
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 1), (3, 4), (2, 3), (), (2, 3, 4, 6)])
def test_lse_of_the_wrong_shape(fn, shape):
    args = zeros()
    args["lse"] = np.zeros(shape)
    expect(
        ValueError,
        lambda: fn(**args),
        f"lse has shape {shape}",
        "expected (2, 3, 4) (..., Nq)",
        "q (2, 3, 4, 8)",
    )


@by_name
@pytest.mark.parametrize("bad", ["yes", 1, 0, None, 1.0, np.int64(1), [True]])
def test_causal_must_be_one_of_its_spellings(fn, bad):
    error, message = causal_refusal(bad)
    expect(error, lambda: fn(**zeros(), causal=bad), message)


@by_name
def test_causal_accepts_numpy_bools(fn):
    args = zeros()
    for flag in (np.True_, np.False_):
        expected = fn(**args, causal=bool(flag))
        for a, b in zip(fn(**args, causal=flag), expected, strict=True):
            np.testing.assert_array_equal(a, b)


@by_name
def test_q_k_v_are_checked_as_in_the_forward(fn):
    args = zeros()
    expect(
        ValueError,
        lambda: fn(**{**args, "k": args["k"][..., :7]}),
        "k has shape (2, 3, 5, 7)",
        "head dim 8",
    )
    expect(
        ValueError,
        lambda: fn(**{**args, "v": args["v"][..., :4, :]}),
        "v has shape (2, 3, 4, 6)",
        "5 keys",
    )
    expect(ValueError, lambda: fn(**{**args, "q": args["q"][0]}), "same rank")
    expect(ValueError, lambda: fn(**{**args, "k": args["k"][:, :2]}), "leading", "k (2, 2, 5, 8)")
    expect(
        ValueError, lambda: fn(**{**args, "q": args["q"][0, 0, 0]}), "q", "at least 2 dimensions"
    )


@by_name
def test_mask_and_scale_are_checked_as_in_the_forward(fn):
    args = zeros()
    expect(
        TypeError, lambda: fn(**args, mask=np.ones((4, 5), dtype=np.int8)), "mask", "int8", "bool"
    )
    expect(
        ValueError,
        lambda: fn(**args, mask=np.ones((4, 4), dtype=bool)),
        "mask has shape (4, 4)",
        "(2, 3, 4, 5)",
    )
    for scale in ("0.5", 1j, True, [0.5]):
        expect(
            TypeError, lambda scale=scale: fn(**args, scale=scale), "scale", type(scale).__name__
        )


@pytest.mark.parametrize("name", ["block_q", "block_k"])
def test_block_sizes(name):
    args = zeros()
    fn = tiled_attention_backward
    for bad in (0, -3):
        expect(ValueError, lambda bad=bad: fn(**args, **{name: bad}), name, ">= 1", str(bad))
    for bad, type_name in ((2.0, "float"), ("64", "str"), (True, "bool"), (None, "NoneType")):
        expect(TypeError, lambda bad=bad: fn(**args, **{name: bad}), name, "int", type_name)
    fn(**args, **{name: np.int32(3)})  # a NumPy integer is an int


HUGE = np.broadcast_to(np.float32(0), (2**19, 8))  # a view: no memory behind it
BEFORE_WORK = [  # (function, one bad argument)
    (fn, bad)
    for fn in BOTH
    for bad in (
        dict(causal="no"),
        dict(mask=np.ones(3, dtype=np.int8)),
        dict(do=np.broadcast_to(np.float32(0), (2**19, 7))),
        dict(lse=np.zeros(3, dtype=np.float32)),
        dict(block_q=0)
        if fn is tiled_attention_backward
        else dict(o=np.broadcast_to(np.int8(0), HUGE.shape)),
    )
]


@pytest.mark.parametrize(
    "fn, bad", BEFORE_WORK, ids=lambda x: x.__name__ if callable(x) else next(iter(x))
)
def test_validation_happens_before_any_work(fn, bad):
    # On a problem whose naive score matrix would need 2**40 bytes, a bad argument must be
    # refused at once: nothing is computed (and nothing large allocated) first.
    lse = np.broadcast_to(np.float32(0), (2**19,))
    args = dict(q=HUGE, k=HUGE, v=HUGE, o=HUGE, lse=lse, do=HUGE) | bad
    with pytest.raises((ValueError, TypeError)):
        fn(**args)
