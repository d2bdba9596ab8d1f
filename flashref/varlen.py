"""Packed (varlen) batches: sequences of different lengths laid end to end, with no padding.

A training batch packs its documents one after another, as FlashAttention's
``flash_attn_varlen_func`` takes them::

    q (total_q, Hq, d),  k (total_k, Hkv, d),  v (total_k, Hkv, dv)
    cu_seqlens_q (B + 1,), cu_seqlens_k (B + 1,)     offsets: 0, then each sequence's end

Sequence ``b``'s queries ``q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]]`` attend to its keys
``k[cu_seqlens_k[b] : cu_seqlens_k[b + 1]]`` (only the first ``seqused_k[b]`` of them where
``seqused_k`` is given) and to no other sequence's: one attention per sequence, computed
here by the tiled loops of ``flashref.tiled_attention`` and ``tiled_attention_backward``
(a reference the GPU's varlen kernels are checked against). ``Hq`` is a multiple of ``Hkv``
(grouped heads), ``dv`` may differ from ``d``; a sequence may have no queries or no keys (its
queries then get zeros and ``lse = -inf``, as in the dense functions).

``causal``: ``False``, ``"bottom_right"`` (flash-attn's mask: query ``i`` of a sequence of
``Lq`` queries and ``Lk`` keys sees keys ``j <= i + Lk - Lq``, its queries being the
sequence's last ``Lq`` positions) or ``"top_left"`` (``j <= i``). ``True`` is refused: in a
packed batch the query and key lengths of a sequence often differ, and ``True`` would not
say which of the two masks is meant (flash-attn's is bottom-right, SDPA's top-left).

The variants of ``flashref.variants`` (``window``, ``softcap``, ``alibi_slopes``, ``sinks``)
apply to each sequence on its own, the window and ALiBi on the sequence's diagonal
``j = i + Lk - Lq`` (as flash-attn's ``window_size`` in its varlen functions); a sink is one
logit per head for every sequence, so the backward returns its gradient summed over them.

``max_seqlen_q`` and ``max_seqlen_k`` are what a GPU kernel sizes its grid by: here each is
checked to be at least the longest sequence's length. The offsets are host arrays of
integers, every value checked (from 0, never decreasing, ending at the packed length),
each error naming the argument and the entry, before any work.
"""

from __future__ import annotations

import numpy as np

from ._checks import check_block, check_causal, group_size, refuse_masked
from .attention import tiled_attention
from .backward import tiled_attention_backward

__all__ = ["varlen_attention", "varlen_attention_backward", "check_cu_seqlens"]


def check_cu_seqlens(cu_seqlens, name: str, total: int) -> np.ndarray:
    """``cu_seqlens`` (a host array of ``B + 1`` integers) checked and returned as int64:
    ``cu_seqlens[0] == 0``, never decreasing, ``cu_seqlens[B] == total`` (the packed length);
    each error names ``name`` and the entry."""
    refuse_masked(cu_seqlens, name)
    try:
        cu = np.asarray(cu_seqlens)
    except Exception as exc:  # a ragged list, an object NumPy cannot convert
        raise TypeError(f"{name} must be a 1-D array of integers ({exc})") from None
    if cu.dtype.kind not in "iu":
        raise TypeError(f"{name} has dtype {cu.dtype}; expected integers (int32)")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} has shape {cu.shape}; expected (B + 1,): 0, then each end")
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        raise ValueError(f"{name}[0] is {cu[0]}; the first sequence starts at 0")
    step = np.flatnonzero(np.diff(cu) < 0)
    if step.size:
        b = int(step[0])
        raise ValueError(
            f"{name}[{b + 1}] is {cu[b + 1]}, before {name}[{b}] = {cu[b]}: the offsets "
            "never decrease (a sequence has a length >= 0)"
        )
    if cu[-1] != total:
        raise ValueError(
            f"{name}[{cu.shape[0] - 1}] is {cu[-1]} but the packed tensor holds {total} tokens; "
            "the last offset is the packed length"
        )
    return cu


def _check_max(max_seqlen, name: str, lengths: np.ndarray, what: str) -> int:
    m = check_block(max_seqlen, name, minimum=0)
    if lengths.size and m < lengths.max():
        b = int(np.argmax(lengths))
        raise ValueError(
            f"{name} is {m} but sequence {b} has {int(lengths[b])} {what}; it must be at least "
            "the longest sequence's length"
        )
    return m


def _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k):
    """The shapes and offsets of a packed call; returns (cu_q, cu_k, keys used per sequence)."""
    layouts = {"q": "(total_q, Hq, d)", "k": "(total_k, Hkv, d)", "v": "(total_k, Hkv, dv)"}
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(x, "shape") and hasattr(x, "ndim")):
            raise TypeError(f"{name} must be an array, got {type(x).__name__}")
        if x.ndim != 3:
            raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {layouts[name]}")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"k has head dim {k.shape[2]} but q has {q.shape[2]}")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(
            f"v has shape {tuple(v.shape)} but k {tuple(k.shape)}: the same tokens and heads"
        )
    group_size(q.shape[1], k.shape[1], f" (q {tuple(q.shape)}, k {tuple(k.shape)})", "k")
    cu_q = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
    cu_k = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0])
    if cu_q.shape != cu_k.shape:
        raise ValueError(
            f"cu_seqlens_q holds {cu_q.shape[0] - 1} sequences but cu_seqlens_k "
            f"{cu_k.shape[0] - 1}; one entry per sequence in each"
        )
    Lq, Lk = np.diff(cu_q), np.diff(cu_k)
    _check_max(max_seqlen_q, "max_seqlen_q", Lq, "queries")
    _check_max(max_seqlen_k, "max_seqlen_k", Lk, "keys")
    if seqused_k is None:
        return cu_q, cu_k, Lk
    refuse_masked(seqused_k, "seqused_k")
    used = np.asarray(seqused_k)
    if used.dtype.kind not in "iu":
        raise TypeError(f"seqused_k has dtype {used.dtype}; expected integers (int32)")
    if used.shape != Lk.shape:
        raise ValueError(f"seqused_k has shape {used.shape}; expected ({Lk.shape[0]},)")
    bad = np.flatnonzero((used < 0) | (used > Lk))
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"seqused_k[{b}] is {int(used[b])}; expected 0 <= seqused_k[{b}] <= {int(Lk[b])}, "
            f"the keys sequence {b} holds"
        )
    return cu_q, cu_k, used.astype(np.int64)


def _mask(causal: str | None, Lq: int, Lk: int):
    """``(causal, mask)`` for the dense function on one sequence."""
    if causal == "bottom_right":
        mask = np.arange(Lk)[None, :] <= np.arange(Lq)[:, None] + (Lk - Lq)  # (Lq, Lk)
        return False, mask
    return causal or False, None


def _causal(causal):
    if isinstance(causal, (bool, np.bool_)) and causal:
        raise ValueError(
            "causal=True does not say which mask in a packed batch, where a sequence's query "
            "and key lengths may differ: pass causal='bottom_right' (query i sees keys "
            "j <= i + Lk - Lq, as flash-attn) or causal='top_left' (j <= i)"
        )
    return check_causal(causal)


def _sequences(cu_q, cu_k, used):
    """(first query, end of the queries, first key, keys used) of each sequence."""
    for b in range(cu_q.shape[0] - 1):
        yield int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(used[b])


def _heads_first(x):
    return np.swapaxes(x, 0, 1)  # (L, H, d) <-> (H, L, d), a view


def varlen_attention(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    causal=False,
    scale=None,
    seqused_k=None,
    return_lse=False,
    block_q=64,
    block_k=64,
    window=None,
    softcap=None,
    alibi_slopes=None,
    sinks=None,
):
    """Attention of a packed batch, each sequence on its own (see the module).

    Args:
        q: ``(total_q, Hq, d)``; k: ``(total_k, Hkv, d)``; v: ``(total_k, Hkv, dv)``.
        cu_seqlens_q, cu_seqlens_k: ``(B + 1,)`` integers, the sequences' offsets.
        max_seqlen_q, max_seqlen_k: ints at least the longest sequence's lengths.
        causal: ``False``, ``"bottom_right"`` or ``"top_left"`` (``True`` is refused).
        scale: default ``1/sqrt(d)``.
        seqused_k: optional ``(B,)`` integers, the keys each sequence uses (its first ones).
        return_lse: also return ``lse (Hq, total_q)``, as flash-attn lays it out.
        block_q, block_k: the tiles of ``flashref.tiled_attention``.
        window, softcap, alibi_slopes, sinks: the variants of ``flashref.variants``, each
            sequence on its own (the window and ALiBi on its diagonal ``j = i + Lk - Lq``).

    Returns:
        ``O (total_q, Hq, dv)`` in q's dtype, or ``(O, lse)``.

    Raises:
        TypeError, ValueError: a bad argument, named, before any work.
    """
    causal = _causal(causal)
    cu_q, cu_k, used = _check_packed(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k
    )
    tiles = {"block_q": block_q, "block_k": block_k, "scale": scale}
    tiles |= {"window": window, "softcap": softcap, "alibi_slopes": alibi_slopes, "sinks": sinks}
    parts = []  # (queries' slice, O (Hq, Lq, dv), lse (Hq, Lq)) of each sequence
    for q0, q1, k0, Lk in _sequences(cu_q, cu_k, used):
        mode, mask = _mask(causal, q1 - q0, Lk)
        qs = _heads_first(q[q0:q1])  # (Hq, Lq, d)
        ks, vs = _heads_first(k[k0 : k0 + Lk]), _heads_first(v[k0 : k0 + Lk])
        Os, ls = tiled_attention(qs, ks, vs, causal=mode, mask=mask, return_lse=True, **tiles)
        parts.append((slice(q0, q1), Os, ls))
    if not parts:  # no sequence: the dense function's dtypes from an empty call
        empty = [_heads_first(x[:0]) for x in (q, k, v)]
        parts.append((slice(0, 0), *tiled_attention(*empty, return_lse=True, **tiles)))
    O = np.zeros((q.shape[0], q.shape[1], v.shape[2]), dtype=parts[0][1].dtype)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf, dtype=parts[0][2].dtype)
    for rows, Os, ls in parts:
        O[rows], lse[:, rows] = _heads_first(Os), ls
    return (O, lse) if return_lse else O


def varlen_attention_backward(
    q,
    k,
    v,
    o,
    lse,
    do,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    causal=False,
    scale=None,
    seqused_k=None,
    block_q=64,
    block_k=64,
    window=None,
    softcap=None,
    alibi_slopes=None,
    sinks=None,
):
    """Gradients ``(dq, dk, dv)`` of ``varlen_attention``, each sequence on its own through
    ``flashref.tiled_attention_backward``; with ``sinks``, their gradient (summed over the
    sequences) comes fourth.

    Args:
        q, k, v: as ``varlen_attention``.
        o: ``(total_q, Hq, dv)``, the forward's output.
        lse: ``(Hq, total_q)``, its lse (``varlen_attention(..., return_lse=True)``).
        do: ``(total_q, Hq, dv)``, dLoss/dO.
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: as ``varlen_attention``.
        causal, scale, seqused_k, block_q, block_k: as ``varlen_attention``.
        window, softcap, alibi_slopes, sinks: as ``varlen_attention``.

    Returns:
        ``dq (total_q, Hq, d)``, ``dk (total_k, Hkv, d)``, ``dv (total_k, Hkv, dv)``; the keys
        past ``seqused_k`` get zero gradients.

    Raises:
        TypeError, ValueError: a bad argument, named, before any work.
    """
    causal = _causal(causal)
    cu_q, cu_k, used = _check_packed(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k
    )
    want = (q.shape[0], q.shape[1], v.shape[2])
    for name, x in (("o", o), ("do", do)):
        if tuple(getattr(x, "shape", ())) != want:
            raise ValueError(
                f"{name} has shape {tuple(getattr(x, 'shape', ()))}; expected {want} "
                "(total_q, Hq, dv)"
            )
    if tuple(getattr(lse, "shape", ())) != (q.shape[1], q.shape[0]):
        raise ValueError(
            f"lse has shape {tuple(getattr(lse, 'shape', ()))}; expected "
            f"{(q.shape[1], q.shape[0])} (Hq, total_q), as varlen_attention returns it"
        )
    tiles = {"block_q": block_q, "block_k": block_k, "scale": scale}
    tiles |= {"window": window, "softcap": softcap, "alibi_slopes": alibi_slopes, "sinks": sinks}
    parts = []  # (queries' slice, keys' slice, dq, dk, dv[, dsinks]) of each sequence
    for q0, q1, k0, Lk in _sequences(cu_q, cu_k, used):
        mode, mask = _mask(causal, q1 - q0, Lk)
        rows, keys = slice(q0, q1), slice(k0, k0 + Lk)
        args = [_heads_first(x[rows]) for x in (q, k, v)]
        args[1:3] = [_heads_first(x[keys]) for x in (k, v)]
        args += [_heads_first(o[rows]), lse[:, rows], _heads_first(do[rows])]
        grads = tiled_attention_backward(*args, causal=mode, mask=mask, **tiles)
        parts.append((rows, keys, *grads))
    if not parts:  # no sequence: the dense function's dtypes from an empty call
        empty = [_heads_first(x[:0]) for x in (q, k, v, o)] + [lse[:, :0], _heads_first(do[:0])]
        parts.append((slice(0, 0), slice(0, 0), *tiled_attention_backward(*empty, **tiles)))
    dq, dk, dv = (
        np.zeros(x.shape, dtype=g.dtype) for x, g in zip((q, k, v), parts[0][2:5], strict=True)
    )
    for rows, keys, dqs, dks, dvs, *_ in parts:
        dq[rows], dk[keys], dv[keys] = _heads_first(dqs), _heads_first(dks), _heads_first(dvs)
    if sinks is None:
        return dq, dk, dv
    return dq, dk, dv, sum(part[5] for part in parts)  # one sink per head, every sequence's
