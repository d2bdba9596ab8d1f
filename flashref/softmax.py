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

Rows that are not ordinary numbers, the same in all three unless noted:

- a row of only ``-inf`` (every score masked) has no weight to share: its
  softmax is all zeros, with no warning. This is the attention functions'
  rule for a fully masked query and ``SoftmaxState``'s for an empty row
  (``m = -inf``, ``l = 0``, result 0). Only such rows: a finite row whose
  ``exp`` underflows to 0 still gives ``0/0 = NaN`` in ``naive_softmax``,
  with NumPy's warning, as chapter 1 shows.
- a row holding a NaN is all NaN.
- a row holding ``+inf`` is all NaN in ``safe_softmax`` and
  ``online_softmax`` (``inf - inf``), and NaN at the ``+inf`` entries, 0
  elsewhere, in ``naive_softmax`` (``inf / inf`` and ``x / inf``); NumPy warns
  "invalid value" in all three.
"""

from __future__ import annotations

import numpy as np

from ._checks import accumulation_dtype, as_float_array, check_axis, check_block
from .state import SoftmaxState, shift_of


def naive_softmax(x, axis: int = -1) -> np.ndarray:
    """Textbook softmax ``exp(x) / sum(exp(x))`` in ``x``'s own dtype.

    Overflows to inf (and then NaN) for large inputs, with NumPy's
    RuntimeWarning, on purpose: use ``safe_softmax`` for real work. The one
    addition to the textbook formula: a row of only ``-inf`` gives zeros.

    Returns:
        The weights, shaped like ``x``, summing to 1 along ``axis``.
    """
    x = as_float_array(x, "x")
    axis = check_axis(axis, x.ndim)
    e = np.exp(x)
    total = e.sum(axis=axis, keepdims=True)
    masked = np.isneginf(x).all(axis=axis, keepdims=True)  # rows of only -inf: weights 0
    return np.divide(e, total, out=np.zeros_like(e), where=~masked)


def safe_softmax(x, axis: int = -1) -> np.ndarray:
    """Softmax with the maximum subtracted first: ``exp(x - max) / sum(exp(x - max))``.

    A row of only ``-inf`` has ``max = -inf``; it is shifted by 0 instead, so its
    exponentials are 0 and so is its sum, and its weights are defined as 0.

    Returns:
        The weights, shaped like ``x``, summing to 1 along ``axis`` (0 for a row of
        only ``-inf``).
    """
    x = as_float_array(x, "x")
    axis = check_axis(axis, x.ndim)
    xa = x.astype(accumulation_dtype(x.dtype))
    m = xa.max(axis=axis, keepdims=True, initial=-np.inf)
    e = np.exp(xa - shift_of(m))
    l = e.sum(axis=axis, keepdims=True)  # >= 1, except 0 for a row of only -inf
    return np.divide(e, l, out=np.zeros_like(e), where=l != 0).astype(x.dtype)


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
    e = np.exp(xa - shift_of(state.m)[..., None])  # (..., N)
    l = state.l[..., None]  # (..., 1): 0 only for a row of only -inf, whose weights are 0
    out = np.divide(e, l, out=np.zeros_like(e), where=l != 0)
    return np.moveaxis(out, -1, axis).astype(x.dtype)
