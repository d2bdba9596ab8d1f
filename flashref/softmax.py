"""Three ways to compute softmax along an axis, from textbook to streaming.

- ``naive_softmax``: ``exp(x) / sum(exp(x))`` exactly as written. It overflows
  once ``exp`` does (x > ~88.7 in float32, > ~11.1 in float16) and NumPy warns;
  that is the point of chapter 1, so nothing here hides it.
- ``safe_softmax``: subtract the row maximum first. Softmax is unchanged by a
  common shift, so this is the same function without the overflow.
- ``online_softmax``: the same values, computed by streaming over the axis in
  blocks with a running maximum and a rescaled running sum (``SoftmaxState``),
  then one more pass to normalise: the algorithm of Milakov and Gimelshein.

The safe and online versions accumulate float16 input in float32 and return
the input's dtype; ``naive_softmax`` computes in the input's own dtype.
"""

from __future__ import annotations

import numpy as np

from ._checks import accumulation_dtype, as_float_array, check_axis, check_block
from .state import SoftmaxState, _reference


def naive_softmax(x, axis: int = -1) -> np.ndarray:
    """Textbook softmax ``exp(x) / sum(exp(x))`` in ``x``'s own dtype.

    Overflows to inf (and then NaN) for large inputs, with NumPy's
    RuntimeWarning, on purpose: use ``safe_softmax`` for real work.
    """
    x = as_float_array(x, "x")
    axis = check_axis(axis, x.ndim)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def safe_softmax(x, axis: int = -1) -> np.ndarray:
    """Softmax with the maximum subtracted first: ``exp(x - max) / sum(exp(x - max))``."""
    x = as_float_array(x, "x")
    axis = check_axis(axis, x.ndim)
    xa = x.astype(accumulation_dtype(x.dtype))
    m = xa.max(axis=axis, keepdims=True, initial=-np.inf)
    e = np.exp(xa - m)
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def online_softmax(x, block_size: int, axis: int = -1) -> np.ndarray:
    """Softmax computed by streaming over ``axis`` in blocks of ``block_size``.

    Pass 1 visits each block once, keeping only the running maximum ``m`` and
    the running sum ``l`` (rescaled by ``exp(m_old - m_new)`` whenever the
    maximum grows). Pass 2 normalises: ``exp(x - m) / l``. Returns the same
    values as ``safe_softmax`` (equal up to rounding), in ``x``'s dtype.
    """
    x = as_float_array(x, "x")
    axis = check_axis(axis, x.ndim)
    block_size = check_block(block_size, "block_size")
    xa = np.moveaxis(x, axis, -1).astype(accumulation_dtype(x.dtype))  # (..., N)
    state = SoftmaxState.empty(xa.shape[:-1], dtype=xa.dtype)
    for start in range(0, xa.shape[-1], block_size):
        state = state.update(xa[..., start : start + block_size])
    out = np.exp(xa - _reference(state.m)[..., None]) / state.l[..., None]
    return np.moveaxis(out, -1, axis).astype(x.dtype)
