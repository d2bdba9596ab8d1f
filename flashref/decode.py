"""Split-KV attention (Flash-Decoding): the keys cut into chunks, the chunks' states merged.

When a model generates text, each step brings one new query per sequence (or a few)
against a long cache of keys and values. The forward kernels give each thread block a
tile of queries, so a batch of one sequence with 32 heads and one query keeps 32 blocks
busy on a GPU with more than a hundred multiprocessors, each streaming its whole K/V
head. Split-KV finds the missing parallelism in the keys instead: the ``Nk`` keys are
cut into ``num_splits`` contiguous chunks, every chunk's partial result is computed on
its own (on a GPU, by its own block), and a small combine step merges the partial
results. The merge is exact, because a finished result ``(O_s, lse_s)`` is a softmax
state (``SoftmaxState.from_output``) and states merge (``merge_states``, chapter 2):

    lse = log(sum_s exp(lse_s))          O = sum_s exp(lse_s - lse) O_s

A chunk whose keys are all masked (or that holds no key, when there are more splits
than keys) has ``lse_s = -inf`` and weight ``exp(-inf) = 0``: it changes nothing.

Shapes, dtypes, ``scale``, ``mask``, grouped K/V heads and the top-left ``causal`` are
those of ``naive_attention`` (``flashref.attention``), which computes each chunk; the
partial results stay in the accumulation dtype until the merge is done.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import numpy as np

from ._checks import check_block, check_flag
from .attention import allowed_pairs, naive_attention, prepare_inputs
from .state import SoftmaxState, merge_states


@dataclass(frozen=True)
class KVSplit:
    """One chunk of the keys and the partial result of attending to it alone.

    Attributes:
        keys: the positions of the chunk's keys, ``range(c0, c1)`` (possibly empty).
        O: ``(..., Hq, Nq, dv)`` the partial output, in the accumulation dtype; zeros for
            queries that may attend to none of these keys.
        lse: ``(..., Hq, Nq)`` its log-sum-exp; ``-inf`` for those queries.
    """

    keys: range
    O: np.ndarray  # (..., Hq, Nq, dv)
    lse: np.ndarray  # (..., Hq, Nq)


def split_bounds(Nk: int, num_splits: int) -> list[range]:
    """Cut ``range(Nk)`` into ``num_splits`` contiguous chunks as even as possible.

    Chunk ``s`` is ``range(s * Nk // num_splits, (s + 1) * Nk // num_splits)``: sizes
    differ by at most one, and with more splits than keys some chunks are empty (they
    are allowed, and merge as nothing).

    Returns:
        A list of ``num_splits`` ranges that cover ``range(Nk)`` in order.
    """
    Nk = check_block(Nk, "Nk", minimum=0)
    S = check_block(num_splits, "num_splits")
    return [range(s * Nk // S, (s + 1) * Nk // S) for s in range(S)]


def split_kv_attention(
    q,
    k,
    v,
    *,
    num_splits,
    scale=None,
    causal=False,
    mask=None,
    return_lse=False,
    return_splits=False,
):
    """Attention with the keys cut into ``num_splits`` chunks and the partial results merged.

    ``q (..., Hq, Nq, d)``, ``k (..., Hkv, Nk, d)``, ``v (..., Hkv, Nk, dv)``, ``scale``,
    ``causal`` (top-left, over the global key positions; ``"bottom_right"`` where it is the
    same mask, ``Nq == Nk``), ``mask`` and ``return_lse`` as in
    ``naive_attention``, whose result it equals up to rounding for every ``num_splits >= 1``
    (more splits than keys is allowed: the extra chunks are empty). Chunks come from
    ``split_bounds``. Each chunk is ordinary attention to a slice of the keys, with the
    slice of the causal and user mask; its ``(O_s, lse_s)`` becomes a state and the states
    are merged in order.

    Returns ``O``, ``(O, lse)``, ``(O, splits)`` or ``(O, lse, splits)``, where ``splits``
    is the list of ``KVSplit`` (each chunk's keys and partial ``O``, ``lse``).
    """
    q, k, v, mask, scale, out_dtype, _ = prepare_inputs(
        q, k, v, scale, mask, causal, return_lse, "split_kv_attention"
    )
    return_splits = check_flag(return_splits, "return_splits")
    causal, return_lse = bool(causal), bool(return_lse)
    Nq, Nk, acc = q.shape[-2], k.shape[-2], scale.dtype
    chunks = split_bounds(Nk, num_splits)

    Q = q.astype(acc, copy=False)  # (..., Hq, Nq, d), unscaled: the scale is passed on
    splits = []
    for keys in chunks:  # on a GPU: one block per (split, head, query tile), all at once
        K_s = k[..., keys.start : keys.stop, :].astype(acc, copy=False)  # (..., Hkv, n, d)
        V_s = v[..., keys.start : keys.stop, :].astype(acc, copy=False)  # (..., Hkv, n, dv)
        mask_s = allowed_pairs(mask, causal, range(Nq), keys)  # (..., Hq, Nq, n) or None
        O_s, lse_s = naive_attention(Q, K_s, V_s, scale=scale, mask=mask_s, return_lse=True)
        splits.append(KVSplit(keys, O_s, lse_s))  # (..., Hq, Nq, dv), (..., Hq, Nq)

    # The combine step: every partial result as a state, merged by its log-sum-exp.
    state = reduce(merge_states, (SoftmaxState.from_output(s.O, s.lse) for s in splits))
    out = (state.result().astype(out_dtype, copy=False),)
    if return_lse:
        out += (state.lse(),)
    if return_splits:
        out += (splits,)
    return out[0] if len(out) == 1 else out
