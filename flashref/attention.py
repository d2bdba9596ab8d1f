"""Attention in NumPy: the naive reference and tiled FlashAttention.

Shapes (``...`` are batch/head dims, equal across q, k, v):
    q (..., Nq, d)   k (..., Nk, d)   v (..., Nk, dv)   ->   O (..., Nq, dv)

Conventions shared by every function here (and by ``flashref.gpu``):

- ``scale`` defaults to ``1/sqrt(d)``; scores are ``S = scale * Q K^T``. Any
  other scale must be a real number (not a bool), finite, nonzero, and
  representable in the accumulation dtype (no ``1e300`` with float32 inputs);
  negative is allowed. The rule and its reasons: ``_checks.check_scale``.
- ``causal`` and ``return_lse`` are bools (Python or NumPy); anything else,
  such as the string ``"False"``, is a TypeError.
- ``causal=True`` is aligned top-left, as in
  ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``: query
  ``i`` sees keys ``j <= i``. (FlashAttention 2.1 and later align bottom-right
  instead, query ``i`` seeing keys ``j <= i + Nk - Nq``; the two agree when
  ``Nq == Nk``.)
- ``mask`` is boolean, broadcastable to ``(..., Nq, Nk)``, True meaning "may
  attend" (the SDPA convention). With ``causal`` too, both must allow a pair.
- A query that may attend to no key (fully masked, or ``Nk == 0``) gets a zero
  output and ``lse = -inf``: no NaN, no warning.
- ``return_lse=True`` returns ``(O, lse)``; ``lse (..., Nq)`` is the natural-log
  log-sum-exp of the scaled, masked scores, in the accumulation dtype.
- float16, float32 and float64 inputs (either byte order; array-likes are
  converted); float16/float32 accumulate in float32, float64 in float64; ``O``
  has the inputs' common dtype.
"""

from __future__ import annotations

import numpy as np

from ._checks import accumulation_dtype, check_block, check_flag, check_mask, check_qkv, check_scale
from .state import SoftmaxState


def _prepare(q, k, v, scale, mask, causal, return_lse):
    """Validate everything before any work; return the inputs uncopied, plus what to cast to.

    ``causal`` and ``return_lse`` are only checked: a NumPy bool works as a Python one.
    """
    check_flag(causal, "causal")
    check_flag(return_lse, "return_lse")
    q, k, v, out_dtype = check_qkv(q, k, v)
    acc = accumulation_dtype(out_dtype)
    scale = acc.type(check_scale(scale, q.shape[-1], acc))
    mask = check_mask(mask, q, k)
    return q, k, v, mask, scale, out_dtype


def _load(x, rows: range, dtype, scale=None):
    """Rows ``rows`` of ``x (..., N, d)`` in the accumulation dtype: one tile, as a kernel loads it.

    Q tiles are multiplied by ``scale`` on the way in, so ``S = Q_i K_j^T`` needs no further
    scaling. A tile already in ``dtype`` and unscaled is a view, not a copy.
    """
    tile = x[..., rows.start : rows.stop, :].astype(dtype, copy=False)  # (..., B, d)
    return tile if scale is None else tile * scale


def _allowed(mask, causal: bool, rows: range, cols: range):
    """Boolean (..., Br, Bc) of pairs that may attend in one tile, or None if all may."""
    allowed = None
    if causal and cols.stop - 1 > rows.start:  # some key in the tile is after some query
        allowed = np.arange(cols.start, cols.stop) <= np.arange(rows.start, rows.stop)[:, None]
    if mask is not None:
        tile = mask[..., rows.start : rows.stop, cols.start : cols.stop]
        allowed = tile if allowed is None else allowed & tile
    return allowed


def _finish(state: SoftmaxState, out_dtype, return_lse: bool):
    out = state.result().astype(out_dtype)
    return (out, state.lse()) if return_lse else out


def naive_attention(q, k, v, *, scale=None, causal=False, mask=None, return_lse=False):
    """Attention the textbook way: materialise S (..., Nq, Nk), softmax it, multiply by V.

    Uses the max-subtracted (safe) softmax, so it does not overflow; its memory
    grows with Nq * Nk, which is exactly what tiling removes. See the module
    docstring for shapes, dtypes, the causal convention and masking.
    """
    q, k, v, mask, scale, out_dtype = _prepare(q, k, v, scale, mask, causal, return_lse)
    Nq, Nk = q.shape[-2], k.shape[-2]
    acc = scale.dtype
    Q, K, V = _load(q, range(Nq), acc, scale), _load(k, range(Nk), acc), _load(v, range(Nk), acc)
    S = Q @ np.swapaxes(K, -1, -2)  # (..., Nq, Nk)
    allowed = _allowed(mask, causal, range(Nq), range(Nk))
    if allowed is not None:
        S = np.where(allowed, S, -np.inf)
    state = SoftmaxState.from_scores(S, V)  # one "tile" holding every key
    return _finish(state, out_dtype, return_lse)


def tiled_attention(
    q, k, v, *, block_q=64, block_k=64, scale=None, causal=False, mask=None, return_lse=False
):
    """FlashAttention's tiled forward pass in NumPy (FlashAttention-2 loop order).

    The outer loop takes ``Br = block_q`` queries at a time; the inner loop
    streams ``Bc = block_k`` keys and values past them, folding each score
    tile ``S_ij (..., Br, Bc)`` into the running state (m, l, O) of the query
    block. No ``(Nq, Nk)`` array is ever formed: extra memory grows with the
    block sizes. With ``causal``, key tiles entirely after the query tile's
    last row are skipped. ``Nq`` and ``Nk`` need not be multiples of the block
    sizes. Conventions as in the module docstring.

    Picking ``block_q`` and ``block_k``: the default 64 x 64 tiles keep the
    loops short to read and trace; they are not the fast choice on a CPU.
    Every tile pays a fixed round of Python and NumPy call overhead, and a
    64 x 64 tile holds too little arithmetic to hide it: on the CPUs this
    library has been measured on, the defaults run slower than
    ``naive_attention``. For speed in NumPy take tiles of a few hundred, such
    as ``block_q=256, block_k=512``; the extra memory stays a few tiles.
    ``python -m flashref.bench cpu`` times naive against tiled attention, and
    a sweep of block sizes, on your machine.
    """
    Br = check_block(block_q, "block_q")
    Bc = check_block(block_k, "block_k")
    q, k, v, mask, scale, out_dtype = _prepare(q, k, v, scale, mask, causal, return_lse)
    Nq, Nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    batch, acc = q.shape[:-2], scale.dtype
    O = np.empty(batch + (Nq, dv), dtype=acc)  # (..., Nq, dv)
    lse = np.empty(batch + (Nq,), dtype=acc)  # (..., Nq)
    for r0 in range(0, Nq, Br):  # Tr query tiles
        rows = range(r0, min(r0 + Br, Nq))
        Qi = _load(q, rows, acc, scale)  # (..., Br, d), scaled
        state = SoftmaxState.empty(batch + (len(rows),), dv, acc)
        k_end = min(Nk, rows.stop) if causal else Nk  # later key tiles are fully masked
        for c0 in range(0, k_end, Bc):  # Tc key tiles
            cols = range(c0, min(c0 + Bc, k_end))
            Kj = _load(k, cols, acc)  # (..., Bc, d)
            Vj = _load(v, cols, acc)  # (..., Bc, dv)
            S = Qi @ np.swapaxes(Kj, -1, -2)  # (..., Br, Bc)
            allowed = _allowed(mask, causal, rows, cols)
            if allowed is not None:
                S = np.where(allowed, S, -np.inf)
            state = state.update(S, Vj)
        O[..., rows.start : rows.stop, :] = state.result()
        lse[..., rows.start : rows.stop] = state.lse()
    O = O.astype(out_dtype, copy=False)
    return (O, lse) if return_lse else O


def tiled_attention_kv_outer(
    q, k, v, *, block_q=64, block_k=64, scale=None, causal=False, mask=None, return_lse=False
):
    """The same computation in the loop order of FlashAttention's Algorithm 1.

    The outer loop loads one key/value tile ``K_j, V_j``; the inner loop
    streams every query tile past it, updating that query tile's running
    state, which Algorithm 1 keeps in HBM between visits. The result equals
    ``tiled_attention``'s up to rounding; only the order of work differs.
    FlashAttention-2 swapped the loops (queries outer) so that each query
    tile's state stays on chip and query tiles run in parallel.
    """
    Br = check_block(block_q, "block_q")
    Bc = check_block(block_k, "block_k")
    q, k, v, mask, scale, out_dtype = _prepare(q, k, v, scale, mask, causal, return_lse)
    Nq, Nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    batch, acc = q.shape[:-2], scale.dtype
    row_tiles = [range(r0, min(r0 + Br, Nq)) for r0 in range(0, Nq, Br)]
    states = [SoftmaxState.empty(batch + (len(rows),), dv, acc) for rows in row_tiles]
    for c0 in range(0, Nk, Bc):  # outer: Tc key/value tiles, each loaded once
        cols = range(c0, min(c0 + Bc, Nk))
        Kj = _load(k, cols, acc)  # (..., Bc, d)
        Vj = _load(v, cols, acc)  # (..., Bc, dv)
        for i, rows in enumerate(row_tiles):  # inner: Tr query tiles, each loaded Tc times
            if causal and cols.start > rows.stop - 1:
                continue  # every key in this tile is after every query: fully masked
            S = _load(q, rows, acc, scale) @ np.swapaxes(Kj, -1, -2)  # (..., Br, Bc)
            allowed = _allowed(mask, causal, rows, cols)
            if allowed is not None:
                S = np.where(allowed, S, -np.inf)
            states[i] = states[i].update(S, Vj)
    O = np.empty(batch + (Nq, dv), dtype=acc)  # (..., Nq, dv)
    lse = np.empty(batch + (Nq,), dtype=acc)  # (..., Nq)
    for rows, state in zip(row_tiles, states, strict=True):  # write each O_i, lse_i once
        O[..., rows.start : rows.stop, :] = state.result()
        lse[..., rows.start : rows.stop] = state.lse()
    O = O.astype(out_dtype, copy=False)
    return (O, lse) if return_lse else O
