"""Ring attention, simulated in one process: one sequence shared by ``world_size`` devices.

When a sequence is too long for one device, each of ``W = world_size`` devices
keeps a shard of the queries and a shard of the keys and values (cut along the
sequence axis, -2). The queries never move. The K/V blocks travel around a
ring: at each of ``W`` steps every device attends its queries to the block it
holds, then passes that block to the next device (``r -> r + 1``, the last
back to the first) and receives one from the previous. After ``W`` steps each
device has seen every block once, and the partial softmax states of its
queries, merged with ``merge_states``, are exactly full attention.

One device, one step: "my queries, at global positions ``P_q``, against the
K/V block I hold, at global positions ``P_k``". That is an ordinary call of
``tiled_attention`` with the boolean mask the positions imply (causal: key
``j`` visible to query ``i`` when ``P_k[j] <= P_q[i]``; otherwise no mask),
returning ``(O, lse)``, which ``SoftmaxState.from_output`` turns into a state.
A step whose mask hides every pair is skipped, as a GPU implementation skips it.

Layouts (``shard_positions``), for a sequence of ``N`` positions:

- ``"contiguous"``: device ``r`` holds the ``r``-th of ``W`` equal blocks.
  With ``causal=True`` this is unbalanced: device 0's queries see only block 0,
  the last device's see everything, and at the last step one device works
  while the others wait.
- ``"zigzag"``: cut the sequence into ``2W`` chunks; device ``r`` holds chunk
  ``r`` and chunk ``2W - 1 - r`` (an early one and a late one). With
  ``causal=True`` every device then does the same work at every step.

``return_schedule=True`` also returns a ``RingSchedule``: which block each
device held at each step and how many (query, key) pairs it computed there.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from .._checks import (
    accumulation_dtype,
    check_block,
    check_causal,
    check_flag,
    check_qkv,
    check_scale,
)
from ..attention import tiled_attention
from ..state import SoftmaxState, merge_states

LAYOUTS = ("contiguous", "zigzag")


@dataclass(frozen=True)
class RingSchedule:
    """What a ring attention run did, step by step (``W = world_size``).

    Attributes:
        layout: ``"contiguous"`` or ``"zigzag"``; causal: whether causal.
        positions: ``W`` arrays ``(N / W,)``: the global positions of device ``r``'s
            queries, which are also those of K/V block ``r`` (the block that starts there).
        held: ``(W, W)`` ints, ``held[step, r]`` = the K/V block device ``r`` holds at ``step``.
        pairs: ``(W, W)`` ints, ``pairs[step, r]`` = the (query, key) pairs device ``r``
            computed at ``step`` (per batch/head): the unmasked ones; 0 means skipped.
    """

    layout: str
    causal: bool
    positions: tuple[np.ndarray, ...]  # W x (N/W,)
    held: np.ndarray  # (W steps, W devices)
    pairs: np.ndarray  # (W steps, W devices)

    @property
    def world_size(self) -> int:
        return len(self.positions)


def check_layout(N: int, world_size, layout) -> int:
    """Validate world size and layout for a sequence of ``N``; return ``world_size`` as an int."""
    W = check_block(world_size, "world_size")
    if not isinstance(layout, str):
        raise TypeError(f"layout must be 'contiguous' or 'zigzag', got {type(layout).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'contiguous' or 'zigzag', got {layout!r}")
    if layout == "contiguous" and N % W:
        raise ValueError(
            f"the contiguous layout cuts the sequence into world_size = {W} equal blocks, "
            f"so its length must be a multiple of {W}; got N = {N}"
        )
    if layout == "zigzag" and N % (2 * W):
        raise ValueError(
            f"the zigzag layout cuts the sequence into 2 * world_size = {2 * W} equal chunks, "
            f"so its length must be a multiple of {2 * W}; got N = {N}"
        )
    return W


def shard_positions(N: int, world_size: int, layout: str = "contiguous") -> list[np.ndarray]:
    """The global positions each device holds: ``world_size`` int arrays ``(N / world_size,)``.

    Together they are a permutation of ``range(N)``; each is sorted.

    Returns:
        A list of ``world_size`` sorted int arrays, device ``r``'s positions at index ``r``.
    """
    if isinstance(N, bool) or not isinstance(N, numbers.Integral):
        raise TypeError(f"N must be an int, got {type(N).__name__}")
    if N < 0:
        raise ValueError(f"N must be >= 0, got {N}")
    W = check_layout(N, world_size, layout)
    if layout == "contiguous":
        return list(np.arange(N).reshape(W, N // W))  # W blocks (N/W,)
    chunks = np.arange(N).reshape(2 * W, N // (2 * W))  # (2W, N/2W)
    return [np.concatenate([chunks[r], chunks[2 * W - 1 - r]]) for r in range(W)]


def _device_step(state, Q, P_q, K, V, P_k, causal, scale, Br, Bc):
    """One device, one step: queries at ``P_q`` against the block at ``P_k``, merged into state.

    Returns the new state and the number of (query, key) pairs computed.
    """
    mask = P_k <= P_q[:, None] if causal else None  # (Nq_r, Nk_b): True = may attend
    pairs = len(P_q) * len(P_k) if mask is None else int(np.count_nonzero(mask))
    if pairs == 0:
        return state, 0  # every key of the block is after every query: nothing to do
    O, lse = tiled_attention(
        Q, K, V, block_q=Br, block_k=Bc, scale=scale, mask=mask, return_lse=True
    )  # (..., Nq_r, dv), (..., Nq_r)
    return merge_states(state, SoftmaxState.from_output(O, lse)), pairs


def ring_attention(
    q,
    k,
    v,
    *,
    world_size,
    causal=False,
    layout="contiguous",
    scale=None,
    block_q=64,
    block_k=64,
    return_lse=False,
    return_schedule=False,
):
    """Attention over one sequence sharded across ``world_size`` simulated devices.

    ``q (..., Hq, N, d)``, ``k (..., Hkv, N, d)``, ``v (..., Hkv, N, dv)``: queries, keys
    and values of the same sequence (so ``Nq == Nk == N``; ``Hq`` a multiple of ``Hkv`` for
    grouped-query attention, as in ``tiled_attention``), which must split evenly under ``layout``:
    ``N`` a multiple of ``world_size`` (``"contiguous"``) or of ``2 * world_size``
    (``"zigzag"``). ``causal``, ``scale``, dtypes and the meaning of ``lse`` are those of
    ``tiled_attention``, which each device runs on its block with tiles ``block_q`` x
    ``block_k``; partial outputs stay in the accumulation dtype until the end.

    Returns ``O``, ``(O, lse)``, ``(O, schedule)`` or ``(O, lse, schedule)``, where
    ``schedule`` is a ``RingSchedule``. Equal to ``naive_attention`` up to rounding.
    """
    q, k, v, out_dtype, _ = check_qkv(q, k, v)  # grouped heads: tiled_attention packs them
    causal = check_causal(causal) is not None  # self-attention: Nq == Nk, both alignments agree
    return_lse = check_flag(return_lse, "return_lse")
    return_schedule = check_flag(return_schedule, "return_schedule")
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"ring attention shards one sequence, so q and k need the same length; got q "
            f"{q.shape} with {q.shape[-2]} queries and k {k.shape} with {k.shape[-2]} keys"
        )
    N, d, dv, batch = q.shape[-2], q.shape[-1], v.shape[-1], q.shape[:-2]
    W = check_layout(N, world_size, layout)
    acc = accumulation_dtype(out_dtype)
    scale = check_scale(scale, d, acc)
    Br, Bc = check_block(block_q, "block_q"), check_block(block_k, "block_k")

    positions = shard_positions(N, W, layout)  # W x (N/W,)
    Q = [q[..., P, :].astype(acc, copy=False) for P in positions]  # device r's (..., N/W, d)
    states = [SoftmaxState.empty(batch + (len(P),), dv, acc) for P in positions]
    # Block b starts on device b and travels with its number, which tells its positions.
    blocks = [
        (b, k[..., P, :].astype(acc, copy=False), v[..., P, :].astype(acc, copy=False))
        for b, P in enumerate(positions)
    ]
    held = np.zeros((W, W), dtype=np.int64)  # (steps, devices)
    pairs = np.zeros((W, W), dtype=np.int64)  # (steps, devices)
    for step in range(W):
        for r in range(W):  # on GPUs these run at the same time, one per device
            b, K, V = blocks[r]  # (..., N/W, d), (..., N/W, dv)
            held[step, r] = b
            states[r], pairs[step, r] = _device_step(
                states[r], Q[r], positions[r], K, V, positions[b], causal, scale, Br, Bc
            )
        if step < W - 1:  # W - 1 moves: after the last step no block needs to travel
            blocks = blocks[-1:] + blocks[:-1]  # send to r + 1, receive from r - 1

    O = np.empty(batch + (N, dv), dtype=acc)  # (..., N, dv)
    lse = np.empty(batch + (N,), dtype=acc)  # (..., N)
    for P, state in zip(positions, states, strict=True):  # gather: back to global order
        O[..., P, :] = state.result()
        lse[..., P] = state.lse()
    out = (O.astype(out_dtype, copy=False),)
    if return_lse:
        out += (lse,)
    if return_schedule:
        out += (RingSchedule(layout, causal, tuple(positions), held, pairs),)
    return out[0] if len(out) == 1 else out
