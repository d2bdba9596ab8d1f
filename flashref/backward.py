"""The backward pass of attention in NumPy: the naive reference and FlashAttention-2's loop.

Given the forward's output ``O``, its log-sum-exp ``lse`` and the gradient ``dO`` of some
loss with respect to ``O``, return the gradients with respect to q, k and v. With
``S = scale * Q K^T`` (disallowed pairs ``-inf``) and the softmax ``P = exp(S - lse)``,
recomputed from ``lse`` instead of stored, the chain rule gives

    dV = P^T dO                dP = dO V^T
    dS = P * (dP - D)          D = rowsum(dO * O), one number per query
    dQ = scale * dS K          dK = scale * dS^T Q

``D`` comes from the softmax's Jacobian: ``dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)``, and
since ``O_i = sum_k P_ik V_k`` that sum is ``dO_i . O_i``, so it costs one dot product per
query instead of a pass over the keys.

Shapes (``...`` are batch dims, equal across every argument; heads on axis -3):
    q (..., Hq, Nq, d)   k (..., Hkv, Nk, d)   v (..., Hkv, Nk, dv)
    o, do (..., Hq, Nq, dv)   lse (..., Hq, Nq)
    ->   dq, dk, dv with the shapes and dtypes of q, k, v

With grouped-query attention (``Hq = G * Hkv``, as in ``flashref.attention``) a K/V head
is used by ``G`` query heads, so its ``dk`` and ``dv`` are the sums of what each of them
contributes. The query heads of a group are packed as the rows of one tile (``pack_heads``),
and the sum happens inside the products ``P^T dO`` and ``dS^T Q``, which run over those
rows: no per-query-head copy of K, V, dK or dV is made.

Conventions as in ``flashref.attention``: ``scale`` defaults to
``1/sqrt(d)``, ``causal`` is aligned top-left (``"bottom_right"`` taken where it is the same
mask, ``Nq == Nk``), ``mask`` is boolean with True meaning "may
attend". ``o`` and ``lse`` are what the forward returned (``return_lse=True``) for the same
q, k, v, scale, causal and mask. The arithmetic is done in the forward's accumulation dtype
(float32 for float16/32 q, k, v; float64 for float64), so that P is recomputed as the
forward computed it; o, lse and do are cast into it. A query whose ``lse`` is ``-inf`` saw
no key: its P is zero, so it adds nothing to dk and dv and its dq row is zero, without NaN
and without warning. A NaN in an input is not an error: it propagates, and as in the
forward it can also reach the rows of its tile that may not attend to it (``0 * NaN``).
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, check_block
from .attention import allowed_pairs, load_tile, pack_heads, prepare_inputs
from .variants import Variants


def _prepare_backward(q, k, v, o, lse, do, scale, causal, mask, where, variants):
    """Validate every argument before any work (q, k, v, scale, mask and the variants as the
    forward does)."""
    q, k, v, mask, scale, _, G = prepare_inputs(q, k, v, scale, mask, causal, False, where)
    var = Variants.of(q, k, G, scale.dtype, causal, where, variants, backward=True)
    causal = bool(causal)  # truthy exactly where it masks (prepare_inputs)
    o = as_float_array(o, "o")
    lse = as_float_array(lse, "lse")
    do = as_float_array(do, "do")
    o_shape = q.shape[:-1] + v.shape[-1:]
    for name, arr in (("o", o), ("do", do)):
        if arr.shape != o_shape:
            raise ValueError(
                f"{name} has shape {arr.shape}; expected {o_shape} (..., Nq, dv) "
                f"for q {q.shape} and v {v.shape}"
            )
    if lse.shape != q.shape[:-1]:
        raise ValueError(
            f"lse has shape {lse.shape}; expected {q.shape[:-1]} (..., Nq) for q {q.shape}"
        )
    return q, k, v, o, lse, do, mask, scale, causal, G, var


def _lse_for_exp(lse, dtype) -> np.ndarray:
    """``lse (..., Nq)`` as a column ``(..., Nq, 1)`` in ``dtype``, ``-inf`` replaced by
    ``+inf``, so that ``exp(S - lse)`` is 0.

    A query that saw no key has ``lse = -inf`` and every score ``-inf``: ``exp(-inf - -inf)``
    would be NaN. With ``+inf`` instead, ``S - lse`` is ``-inf`` whatever S is, and P is 0.
    A NaN stays NaN. As a column, its row tiles pack like those of q (``pack_heads``).
    """
    L = lse.astype(dtype)[..., None]  # (..., Nq, 1), a copy
    L[np.isneginf(L)] = np.inf
    return L


def finish_output(q, k, v, dQ, dK, dV, var=None, L=None, D=None):
    """The gradients in the dtypes of the inputs they belong to; with sinks, their gradient
    (from ``L`` and ``D``, ``Variants.sink_grad``) comes fourth."""
    grads = (
        dQ.astype(q.dtype, copy=False),
        dK.astype(k.dtype, copy=False),
        dV.astype(v.dtype, copy=False),
    )
    if var is None or var.sinks is None:
        return grads
    return grads + (var.sink_grad(L, D),)


def naive_attention_backward(
    q, k, v, o, lse, do, *, scale=None, causal=False, mask=None, **variants
):
    """The backward pass the textbook way: every (..., Nq, Nk) matrix materialised at once.

    Returns ``(dq, dk, dv)``, and ``dsinks`` fourth when ``sinks`` is given. Its memory
    grows with Nq * Nk (S, P, dP and dS), which is what the tiled version removes. See the
    module docstring for the formulas, shapes, dtypes and conventions; ``**variants`` are
    the forward's (``flashref.variants``), and a ``score_mod`` needs ``score_mod_grad``,
    its derivative.
    """
    q, k, v, o, lse, do, mask, scale, causal, G, var = _prepare_backward(
        q, k, v, o, lse, do, scale, causal, mask, "naive_attention_backward", variants
    )
    Nq, Nk = q.shape[-2], k.shape[-2]
    rows, cols, acc = range(Nq), range(Nk), scale.dtype
    Q = pack_heads(load_tile(q, rows, acc, scale), G)  # (..., Hkv, G * Nq, d)
    K, V = load_tile(k, cols, acc), load_tile(v, cols, acc)  # (..., Hkv, Nk, d / dv)
    O = pack_heads(load_tile(o, rows, acc), G)  # (..., Hkv, G * Nq, dv)
    dO = pack_heads(load_tile(do, rows, acc), G)  # (..., Hkv, G * Nq, dv)
    L = pack_heads(_lse_for_exp(lse, acc), G)  # (..., Hkv, G * Nq, 1)
    S = Q @ np.swapaxes(K, -1, -2)  # (..., Hkv, G * Nq, Nk)
    S, dS_ds = var.scores(S, rows, cols, grad=True)  # and their derivative, or None
    allowed = var.allowed(allowed_pairs(mask, causal, rows, cols, G), rows, cols)
    if allowed is not None:
        S = np.where(allowed, S, -np.inf)
    P = np.exp(S - L)  # (..., Hkv, G * Nq, Nk), the forward's softmax
    dV = np.swapaxes(P, -1, -2) @ dO  # (..., Hkv, Nk, dv), summed over the group's heads
    dP = dO @ np.swapaxes(V, -1, -2)  # (..., Hkv, G * Nq, Nk)
    D = np.sum(dO * O, axis=-1, keepdims=True)  # (..., Hkv, G * Nq, 1)
    dS = P * (dP - D)  # (..., Hkv, G * Nq, Nk)
    dS = dS if dS_ds is None else dS * dS_ds  # the chain rule: softcap, score_mod
    dQ = scale * (dS @ K)  # (..., Hkv, G * Nq, d)
    dK = np.swapaxes(dS, -1, -2) @ Q  # (..., Hkv, Nk, d); Q already carries the scale
    return finish_output(q, k, v, dQ.reshape(q.shape), dK, dV, var, L, D)


def tiled_attention_backward(
    q, k, v, o, lse, do, *, block_q=64, block_k=64, scale=None, causal=False, mask=None, **variants
):
    """FlashAttention-2's backward pass in NumPy: key/value tiles outside, query tiles inside.

    Returns ``(dq, dk, dv)``. First ``D = rowsum(dO * O)`` for every query, once. Then the
    outer loop takes ``Bc = block_k`` keys and values at a time and keeps their gradients
    ``dK_j, dV_j`` on chip; the inner loop streams ``Br = block_q`` queries past them,
    recomputing the score tile ``S_ij (..., Br, Bc)`` and ``P_ij = exp(S_ij - lse_i)``, and
    adds each tile's share to ``dK_j``, ``dV_j`` and to ``dQ_i``, which accumulates across
    key tiles (on a GPU, in global memory by atomics or a second pass). No ``(Nq, Nk)``
    array is formed: extra memory grows with the block sizes. With ``causal``, query tiles
    entirely before the key tile's first key are skipped. Conventions as in the module
    docstring, ``**variants`` as in ``naive_attention_backward``.
    """
    Br = check_block(block_q, "block_q")
    Bc = check_block(block_k, "block_k")
    q, k, v, o, lse, do, mask, scale, causal, G, var = _prepare_backward(
        q, k, v, o, lse, do, scale, causal, mask, "tiled_attention_backward", variants
    )
    Nq, Nk, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    batch, kv_batch, acc = q.shape[:-2], k.shape[:-2], scale.dtype
    L = _lse_for_exp(lse, acc)  # (..., Hq, Nq, 1)
    D = np.empty(batch + (Nq, 1), dtype=acc)  # (..., Hq, Nq, 1)
    for r0 in range(0, Nq, Br):  # D_i = rowsum(dO_i * O_i), before the main loop
        rows = range(r0, min(r0 + Br, Nq))
        dOi, Oi = load_tile(do, rows, acc), load_tile(o, rows, acc)  # (..., Hq, Br, dv)
        D[..., rows.start : rows.stop, :] = np.sum(dOi * Oi, axis=-1, keepdims=True)
    dQ = np.zeros(batch + (Nq, d), dtype=acc)  # (..., Hq, Nq, d), summed over key tiles
    dK = np.empty(kv_batch + (Nk, d), dtype=acc)  # (..., Hkv, Nk, d)
    dV = np.empty(kv_batch + (Nk, dv), dtype=acc)  # (..., Hkv, Nk, dv)
    for c0 in range(0, Nk, Bc):  # outer: Tc key/value tiles, each loaded once
        cols = range(c0, min(c0 + Bc, Nk))
        Kj = load_tile(k, cols, acc)  # (..., Hkv, Bc, d)
        Vj = load_tile(v, cols, acc)  # (..., Hkv, Bc, dv)
        dKj = np.zeros(kv_batch + (len(cols), d), dtype=acc)  # (..., Hkv, Bc, d), on chip
        dVj = np.zeros(kv_batch + (len(cols), dv), dtype=acc)  # (..., Hkv, Bc, dv), on chip
        r_start = c0 // Br * Br if causal else 0  # earlier query tiles see none of these keys
        for r0 in range(r_start, Nq, Br):  # inner: Tr query tiles
            rows = range(r0, min(r0 + Br, Nq))
            if var.skips(rows, cols):
                continue  # the window or mask_mod leaves no pair of this tile
            Qi = pack_heads(load_tile(q, rows, acc, scale), G)  # (..., Hkv, G * Br, d), scaled
            dOi = pack_heads(load_tile(do, rows, acc), G)  # (..., Hkv, G * Br, dv)
            Li = pack_heads(L[..., rows.start : rows.stop, :], G)  # (..., Hkv, G * Br, 1)
            Di = pack_heads(D[..., rows.start : rows.stop, :], G)  # (..., Hkv, G * Br, 1)
            S = Qi @ np.swapaxes(Kj, -1, -2)  # (..., Hkv, G * Br, Bc)
            S, dS_ds = var.scores(S, rows, cols, grad=True)  # and their derivative, or None
            allowed = var.allowed(allowed_pairs(mask, causal, rows, cols, G), rows, cols)
            if allowed is not None:
                S = np.where(allowed, S, -np.inf)
            P = np.exp(S - Li)  # (..., Hkv, G * Br, Bc), recomputed
            dVj += np.swapaxes(P, -1, -2) @ dOi  # (..., Hkv, Bc, dv), over the group's heads
            dP = dOi @ np.swapaxes(Vj, -1, -2)  # (..., Hkv, G * Br, Bc)
            dS = P * (dP - Di)  # (..., Hkv, G * Br, Bc)
            dS = dS if dS_ds is None else dS * dS_ds  # the chain rule: softcap, score_mod
            dQi = dQ[..., rows.start : rows.stop, :]  # (..., Hq, Br, d), a view
            dQi += (scale * (dS @ Kj)).reshape(dQi.shape)  # (..., Hkv, G * Br, d) to its heads
            dKj += np.swapaxes(dS, -1, -2) @ Qi  # (..., Hkv, Bc, d); Qi carries the scale
        dK[..., cols.start : cols.stop, :] = dKj  # each dK_j, dV_j written once
        dV[..., cols.start : cols.stop, :] = dVj
    return finish_output(q, k, v, dQ, dK, dV, var, L, D)
