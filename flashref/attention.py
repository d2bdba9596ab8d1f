"""Attention in NumPy: the naive reference and tiled FlashAttention.

Shapes (``...`` are batch dims, equal across q, k, v; ``H`` the head axis, -3):
    q (..., Hq, Nq, d)   k (..., Hkv, Nk, d)   v (..., Hkv, Nk, dv)   ->   O (..., Hq, Nq, dv)

``Hq == Hkv`` is ordinary multi-head attention. Grouped-query attention (GQA) has
``Hq`` a multiple of ``Hkv``: each K/V head serves ``G = Hq // Hkv`` consecutive query
heads, query head ``h`` using K/V head ``h // G`` (``Hkv == 1`` is multi-query
attention), as in ``scaled_dot_product_attention(enable_gqa=True)``. K and V are never
copied per query head: the ``G`` query heads of a group are stacked as the rows of one
tile (``pack_heads``), which then meets its K/V head once. 2-D inputs ``(N, d)`` have no head
axis (``G = 1``).

Conventions shared by every function here (and by ``flashref.gpu``):

- ``scale`` defaults to ``1/sqrt(d)``; scores are ``S = scale * Q K^T``. Any
  other scale must be a real number (not a bool), finite, nonzero, and
  representable in the accumulation dtype (no ``1e300`` with float32 inputs);
  negative is allowed. The rule and its reasons: ``_checks.check_scale``.
- ``causal`` is spelled as everywhere in flashref (``_checks.check_causal``):
  ``False``, ``True`` or ``"top_left"`` (query ``i`` sees keys ``j <= i``, as
  ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``), or
  ``"bottom_right"`` (query ``i`` sees keys ``j <= i + Nk - Nq``, as FlashAttention
  2.1 and later align it). These functions mask top-left, so they take
  ``"bottom_right"`` where it is the same mask (``Nq == Nk``) and refuse it, naming
  the functions that mask bottom-right, where it is not. ``return_lse`` is a bool
  (Python or NumPy); anything else, such as the string ``"False"``, is a TypeError.
- ``mask`` is boolean, broadcastable to ``(..., Nq, Nk)``, True meaning "may
  attend" (the SDPA convention). With ``causal`` too, both must allow a pair.
- ``naive_attention`` and ``tiled_attention`` also take the variants of
  ``flashref.variants`` as keywords (``**variants``: ``window``, ``softcap``,
  ``alibi_slopes``, ``sinks``, ``score_mod``, ``mask_mod``); none by default.
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

from ._checks import (
    accumulation_dtype,
    causal_top_left,
    check_block,
    check_causal,
    check_flag,
    check_mask,
    check_qkv,
    check_scale,
)
from .state import SoftmaxState
from .variants import Variants


def prepare_inputs(q, k, v, scale, mask, causal, return_lse, where="this function"):
    """Validate everything before any work; return the inputs uncopied, plus what to cast to
    and ``G``, the number of query heads per K/V head.

    ``causal`` and ``return_lse`` are only checked (a NumPy bool works as a Python one, and
    ``causal`` is truthy exactly where it masks: ``"bottom_right"`` passes only where it is the
    top-left mask); ``where`` names the caller in the error.
    """
    check_causal(causal)
    check_flag(return_lse, "return_lse")
    q, k, v, out_dtype, G = check_qkv(q, k, v)
    causal_top_left(causal, q.shape[-2], k.shape[-2], where)
    acc = accumulation_dtype(out_dtype)
    scale = acc.type(check_scale(scale, q.shape[-1], acc))
    mask = check_mask(mask, q, k)
    return q, k, v, mask, scale, out_dtype, G


def load_tile(x, rows: range, dtype, scale=None):
    """Rows ``rows`` of ``x (..., N, d)`` in the accumulation dtype: one tile, as a kernel loads it.

    Q tiles are multiplied by ``scale`` on the way in, so ``S = Q_i K_j^T`` needs no further
    scaling. A tile already in ``dtype`` and unscaled is a view, not a copy.
    """
    tile = x[..., rows.start : rows.stop, :].astype(dtype, copy=False)  # (..., B, d)
    return tile if scale is None else tile * scale


def pack_heads(tile, G: int):
    """Stack the query heads that share a K/V head: ``(..., Hq, B, w) -> (..., Hkv, G * B, w)``.

    Query heads ``h = j * G .. j * G + G - 1`` all use K/V head ``j``; as rows of one tile
    they meet ``K_j`` and ``V_j`` in one matrix product, so K and V are never repeated per
    query head, and the gradients of a shared K/V head sum over its query heads inside that
    product. Row ``g * B + i`` of the packed tile is row ``i`` of query head ``j * G + g``;
    ``x.reshape(q_shape)`` undoes it. A plain reshape of the head and row axes: a view when
    ``G == 1`` (or the layout allows), else a copy of the tile. A GPU decode kernel packs
    the same way, filling the rows of its matrix unit with the group's heads.
    """
    if G == 1:
        return tile
    *lead, Hq, B, w = tile.shape
    return tile.reshape(*lead, Hq // G, G * B, w)  # (..., Hkv, G * B, w)


def allowed_pairs(mask, causal: bool, rows: range, cols: range, G: int = 1):
    """Boolean (..., G * Br, Bc) of pairs that may attend in one packed tile, or None if all
    may (rows packed as in ``pack_heads``; ``mask`` broadcast to (..., Hq, Nq, Nk))."""
    allowed = None
    if causal and cols.stop - 1 > rows.start:  # some key in the tile is after some query
        allowed = np.arange(cols.start, cols.stop) <= np.arange(rows.start, rows.stop)[:, None]
        if G > 1:
            allowed = np.tile(allowed, (G, 1))  # (G * Br, Bc): every head of the group alike
    if mask is not None:
        tile = pack_heads(mask[..., rows.start : rows.stop, cols.start : cols.stop], G)
        allowed = tile if allowed is None else allowed & tile
    return allowed


def store_tile(O, lse, rows: range, state: SoftmaxState) -> None:
    """Write one packed query tile's result into O (..., Hq, Nq, dv) and lse (..., Hq, Nq)."""
    O_i = O[..., rows.start : rows.stop, :]  # (..., Hq, Br, dv), a view
    O_i[...] = state.result().reshape(O_i.shape)  # (..., Hkv, G * Br, dv) back to its heads
    lse_i = lse[..., rows.start : rows.stop]  # (..., Hq, Br)
    lse_i[...] = state.lse().reshape(lse_i.shape)


def finish_output(O, lse, out_dtype, return_lse: bool):
    O = O.astype(out_dtype, copy=False)
    return (O, lse) if return_lse else O


def naive_attention(q, k, v, *, scale=None, causal=False, mask=None, return_lse=False, **variants):
    """Attention the textbook way: materialise S (..., Nq, Nk), softmax it, multiply by V.

    Uses the max-subtracted (safe) softmax, so it does not overflow; its memory
    grows with Nq * Nk, which is exactly what tiling removes. See the module
    docstring for shapes, dtypes, the causal convention and masking; ``**variants`` are
    the keywords of ``flashref.variants`` (``window``, ``softcap``, ``alibi_slopes``,
    ``sinks``, ``score_mod``, ``mask_mod``), none by default.

    Returns:
        ``O (..., Hq, Nq, dv)`` in the inputs' common dtype, or ``(O, lse)`` with
        ``return_lse=True`` (``lse (..., Hq, Nq)`` in the accumulation dtype).
    """
    q, k, v, mask, scale, out_dtype, G = prepare_inputs(
        q, k, v, scale, mask, causal, return_lse, "naive_attention"
    )
    var = Variants.of(q, k, G, scale.dtype, causal, "naive_attention", variants)
    Nq, Nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    rows, cols, acc = range(Nq), range(Nk), scale.dtype
    Q = pack_heads(load_tile(q, rows, acc, scale), G)  # (..., Hkv, G * Nq, d)
    K, V = load_tile(k, cols, acc), load_tile(v, cols, acc)  # (..., Hkv, Nk, d / dv)
    S = Q @ np.swapaxes(K, -1, -2)  # (..., Hkv, G * Nq, Nk)
    S = var.scores(S, rows, cols)  # softcap, ALiBi, score_mod: S itself without them
    allowed = var.allowed(allowed_pairs(mask, causal, rows, cols, G), rows, cols)
    if allowed is not None:
        S = np.where(allowed, S, -np.inf)
    state = var.first_state(S.shape[:-1], dv, rows).update(S, V)  # one "tile": every key
    O = state.result().reshape(q.shape[:-1] + (dv,))  # (..., Hq, Nq, dv)
    return finish_output(O, state.lse().reshape(q.shape[:-1]), out_dtype, return_lse)


def tiled_attention(
    q,
    k,
    v,
    *,
    block_q=64,
    block_k=64,
    scale=None,
    causal=False,
    mask=None,
    return_lse=False,
    **variants,
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

    ``**variants`` are the keywords of ``flashref.variants`` (none by default):
    they change a tile's scores and mask, start each query tile's state from the
    sink, and skip the tiles the window or ``mask_mod`` leaves empty.

    Returns:
        ``O (..., Hq, Nq, dv)``, or ``(O, lse)`` with ``return_lse=True``: as
        ``naive_attention``, equal to it up to rounding.
    """
    Br = check_block(block_q, "block_q")
    Bc = check_block(block_k, "block_k")
    q, k, v, mask, scale, out_dtype, G = prepare_inputs(
        q, k, v, scale, mask, causal, return_lse, "tiled_attention"
    )
    var = Variants.of(q, k, G, scale.dtype, causal, "tiled_attention", variants)
    Nq, Nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    batch, kv_batch, acc = q.shape[:-2], k.shape[:-2], scale.dtype
    O = np.empty(batch + (Nq, dv), dtype=acc)  # (..., Hq, Nq, dv)
    lse = np.empty(batch + (Nq,), dtype=acc)  # (..., Hq, Nq)
    for r0 in range(0, Nq, Br):  # Tr query tiles
        rows = range(r0, min(r0 + Br, Nq))
        Qi = pack_heads(load_tile(q, rows, acc, scale), G)  # (..., Hkv, G * Br, d), scaled
        state = var.first_state(kv_batch + (G * len(rows),), dv, rows)  # empty, or a sink's
        k_end = min(Nk, rows.stop) if causal else Nk  # later key tiles are fully masked
        for c0 in range(0, k_end, Bc):  # Tc key tiles
            cols = range(c0, min(c0 + Bc, k_end))
            if var.skips(rows, cols):
                continue  # the window or mask_mod leaves no pair of this tile
            Kj = load_tile(k, cols, acc)  # (..., Hkv, Bc, d)
            Vj = load_tile(v, cols, acc)  # (..., Hkv, Bc, dv)
            S = Qi @ np.swapaxes(Kj, -1, -2)  # (..., Hkv, G * Br, Bc)
            S = var.scores(S, rows, cols)  # softcap, ALiBi, score_mod: S itself without them
            allowed = var.allowed(allowed_pairs(mask, causal, rows, cols, G), rows, cols)
            if allowed is not None:
                S = np.where(allowed, S, -np.inf)
            state = state.update(S, Vj)
        store_tile(O, lse, rows, state)
    return finish_output(O, lse, out_dtype, return_lse)


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

    Returns:
        ``O``, or ``(O, lse)``: as ``tiled_attention``.
    """
    Br = check_block(block_q, "block_q")
    Bc = check_block(block_k, "block_k")
    q, k, v, mask, scale, out_dtype, G = prepare_inputs(
        q, k, v, scale, mask, causal, return_lse, "tiled_attention_kv_outer"
    )
    Nq, Nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    batch, kv_batch, acc = q.shape[:-2], k.shape[:-2], scale.dtype
    row_tiles = [range(r0, min(r0 + Br, Nq)) for r0 in range(0, Nq, Br)]
    states = [SoftmaxState.empty(kv_batch + (G * len(rows),), dv, acc) for rows in row_tiles]
    for c0 in range(0, Nk, Bc):  # outer: Tc key/value tiles, each loaded once
        cols = range(c0, min(c0 + Bc, Nk))
        Kj = load_tile(k, cols, acc)  # (..., Hkv, Bc, d)
        Vj = load_tile(v, cols, acc)  # (..., Hkv, Bc, dv)
        for i, rows in enumerate(row_tiles):  # inner: Tr query tiles, each loaded Tc times
            if causal and cols.start > rows.stop - 1:
                continue  # every key in this tile is after every query: fully masked
            Qi = pack_heads(load_tile(q, rows, acc, scale), G)  # (..., Hkv, G * Br, d), scaled
            S = Qi @ np.swapaxes(Kj, -1, -2)  # (..., Hkv, G * Br, Bc)
            allowed = allowed_pairs(mask, causal, rows, cols, G)
            if allowed is not None:
                S = np.where(allowed, S, -np.inf)
            states[i] = states[i].update(S, Vj)
    O = np.empty(batch + (Nq, dv), dtype=acc)  # (..., Hq, Nq, dv)
    lse = np.empty(batch + (Nq,), dtype=acc)  # (..., Hq, Nq)
    for rows, state in zip(row_tiles, states, strict=True):  # write each O_i, lse_i once
        store_tile(O, lse, rows, state)
    return finish_output(O, lse, out_dtype, return_lse)
