"""Ring attention on real devices: one process per device, K/V blocks passed by NCCL.

``flashref.ring`` simulates the ring in one process. Here each of ``W`` processes
(a *rank*) owns one device and holds its shard of ``q``, ``k``, ``v`` (the layouts and
positions of ``flashref.ring.shard_positions``). At each of ``W`` steps a rank

1. starts sending the K/V block it holds to rank ``r + 1`` and receiving the one rank
   ``r - 1`` holds (``dist.batch_isend_irecv``: NCCL on GPUs, gloo on CPUs), issued from
   a second CUDA stream so that the transfer runs while the kernel of step 2 runs;
2. computes the partial ``(O, lse)`` of its queries against the block it holds with a
   local attention function (``flash_attend``: flashref's kernel; ``reference_attend``:
   float64 torch on the CPU) and merges it into its running ``(O, lse)`` by ``merge``;
3. waits for the transfer, and the received block becomes the one it holds.

Causal masks: the positions of a rank's queries and of a block's keys are runs of
consecutive positions (one run per contiguous shard, two per zigzag shard). Between a
query run and a key run the causal mask is ``"full"`` (every key before every query),
``"none"`` (every key after every query: skipped) or ``"diagonal"`` (the same positions:
top-left causal, right because the two runs have equal length). ``pair_mask`` decides.

torch is imported only here; ``import flashref`` does not import this module.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.distributed as dist

from ..gpu import flash_attention
from .simulate import check_layout, shard_positions


def merge(O_a, lse_a, O_b, lse_b):
    """Merge two partial results over disjoint keys: ``O (..., n, dv)``, ``lse (..., n)``.

    The rule of ``flashref.state.merge_states`` applied to ``SoftmaxState.from_output``
    states (``m = lse``, ``l = 1``): weights ``exp(lse - lse_max)``; a row with
    ``lse = -inf`` saw no key and weighs 0; a row empty in both stays zeros, ``lse = -inf``.
    NaN propagates. Computed in the dtype of ``O_a`` (``O_b`` is promoted).
    """
    m = torch.maximum(lse_a, lse_b)  # (..., n)
    shift = torch.where(torch.isneginf(m), 0, m)  # 0 for empty rows: -inf - -inf would be NaN
    w_a = torch.exp(lse_a - shift)  # (..., n)
    w_b = torch.exp(lse_b - shift)
    l = w_a + w_b  # (..., n): 0 only where both are empty
    o = O_a * w_a[..., None] + O_b.to(O_a.dtype) * w_b[..., None]  # (..., n, dv)
    O = torch.where(l[..., None] != 0, o / l[..., None], 0)
    lse = torch.where(l != 0, torch.log(l), -torch.inf) + shift
    return O, lse


def reference_attend(q, k, v, *, causal, scale):
    """Local attention on the CPU in q's dtype (float64 for the tests): ``(O, lse)``."""
    S = (q @ k.transpose(-1, -2)) * scale  # (..., nq, nk)
    if causal:  # top-left: query i sees keys j <= i
        S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).triu(1), -torch.inf)
    lse = torch.logsumexp(S, dim=-1)  # (..., nq); -inf for a row with no key
    P = torch.exp(S - torch.where(torch.isneginf(lse), 0, lse)[..., None])  # (..., nq, nk)
    return P @ v, lse  # (..., nq, dv), (..., nq)


def flash_attend(q, k, v, *, causal, scale):
    """Local attention on the GPU: ``flashref.gpu.flash_attention`` on torch CUDA tensors.

    CuPy launches on its own current stream, so the kernel is sent to torch's current
    stream: the one this rank computes on, apart from the stream the transfers use.
    """
    import cupy

    stream = torch.cuda.current_stream()
    with cupy.cuda.ExternalStream(stream.cuda_stream, stream.device_index):
        return flash_attention(q, k, v, causal=causal, scale=scale, return_lse=True)


def runs(P: np.ndarray) -> list[tuple[int, int, slice]]:
    """A shard's positions ``P`` as runs of consecutive positions: (first, length, local slice)."""
    cuts = [0, *(np.flatnonzero(np.diff(P) != 1) + 1).tolist(), len(P)]
    return [(int(P[a]), b - a, slice(a, b)) for a, b in zip(cuts, cuts[1:], strict=False)]


def pair_mask(q_first: int, nq: int, k_first: int, nk: int) -> str:
    """Causal mask between queries at ``q_first + [0, nq)`` and keys at ``k_first + [0, nk)``."""
    if k_first > q_first + nq - 1:
        return "none"  # every key comes after every query
    if k_first + nk - 1 <= q_first:
        return "full"  # every key is at or before every query
    if k_first == q_first and nk == nq:
        return "diagonal"  # the same positions: top-left causal is exactly j <= i
    raise ValueError(  # the layouts of flashref.ring never produce this
        f"queries at {q_first}..{q_first + nq - 1} and keys at {k_first}..{k_first + nk - 1} "
        "overlap without being the same positions; only full, none or diagonal pairs are handled"
    )


def _calls(q_runs, k_runs, causal: bool, own: bool):
    """The kernel calls of one step: ``(query slice, key slice, "full" or "diagonal")``.

    A rank's own block (``own``) under the causal mask is one diagonal call: its positions
    are sorted, so local ``j <= i`` is global ``P[j] <= P[i]``. Otherwise each query run
    meets each key run; "none" pairs are skipped, and a query run that sees the whole
    block unmasked sees it in one call.
    """
    if not causal or own:
        return [(slice(None), slice(None), "diagonal" if causal else "full")]
    calls = []
    for q_first, nq, qs in q_runs:
        masks = [(ks, pair_mask(q_first, nq, k_first, nk)) for k_first, nk, ks in k_runs]
        if all(m == "full" for _, m in masks):
            masks = [(slice(None), "full")]  # the whole block in one call
        calls += [(qs, ks, m) for ks, m in masks if m != "none"]
    return calls


def shard(x, rank: int, world_size: int, layout: str):
    """Rank ``rank``'s shard of ``x (..., N, d)`` along the sequence axis (a contiguous copy)."""
    P = shard_positions(x.shape[-2], world_size, layout)[rank]  # (N/W,)
    return x[..., torch.as_tensor(P, device=x.device), :].contiguous()  # (..., N/W, d)


def unshard(shards, layout: str):
    """Put ``W`` shards ``(..., N/W, dv)`` back in global order: ``(..., N, dv)``."""
    W, n = len(shards), shards[0].shape[-2]
    out = torch.empty(
        (*shards[0].shape[:-2], W * n, shards[0].shape[-1]),
        dtype=shards[0].dtype,
        device=shards[0].device,
    )  # (..., N, dv)
    for P, s in zip(shard_positions(W * n, W, layout), shards, strict=True):
        out[..., torch.as_tensor(P, device=out.device), :] = s
    return out


def ring_forward(q, k, v, *, N, causal, layout, attend, scale=None, timings=None, group=None):
    """This rank's part of ring attention; ``dist`` must be initialised (any backend).

    ``q (..., n, d)``, ``k (..., n, d)``, ``v (..., n, dv)``: this rank's shard
    (``shard``), ``n = N / world_size``. ``attend(q, k, v, causal=, scale=)`` returns
    ``(O, lse)``. Returns ``(O, lse, pairs)``: ``O (..., n, dv)`` in q's dtype, ``lse
    (..., n)`` (float32; float64 for float64 input) and ``pairs[step]``, the (query, key)
    pairs computed at each step, as ``RingSchedule.pairs[:, rank]``. On CUDA, a list
    ``timings`` receives one dict of CUDA events per step (``step_times`` reads them).

    ``group``: the process group the ring runs in (default: the default group), so that a
    ring can be one dimension of a larger mesh; ranks and the shard index are the group's.
    The ring sets no environment variable: what a machine's NCCL needs (for example
    ``NCCL_NVLS_ENABLE=0`` where NVLink multicast must stay off) is the launcher's to set
    (``python -m flashref.bench ring --no-multicast``).
    """
    rank, W = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("this process is not a member of group: call ring_forward on its ranks")
    send_to = _global(group, (rank + 1) % W)
    recv_from = _global(group, (rank - 1) % W)
    check_layout(N, W, layout)
    if q.shape[-2] * W != N:
        raise ValueError(
            f"q has {q.shape[-2]} queries; a shard of N = {N} over {W} ranks has {N // W}"
        )
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    positions = shard_positions(N, W, layout)  # W x (n,)
    block_runs = [runs(P) for P in positions]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    O = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=acc, device=q.device)  # (..., n, dv)
    lse = torch.full(q.shape[:-1], -torch.inf, dtype=acc, device=q.device)  # (..., n)
    K, V = k.contiguous(), v.contiguous()  # the block held: (..., n, d), (..., n, dv)
    K_next, V_next = torch.empty_like(K), torch.empty_like(V)  # where the next one arrives
    cuda = q.is_cuda
    compute = torch.cuda.current_stream() if cuda else None
    comm = torch.cuda.Stream() if cuda else None
    pairs = []
    for step in range(W):
        b = (rank - step) % W  # the block this rank holds now (it started on rank b)
        moves = step < W - 1  # W - 1 moves: after the last step nothing needs to travel
        names = _EVENTS if moves else _EVENTS[2:]
        ev = {n: torch.cuda.Event(enable_timing=True) for n in names} if cuda else None
        if moves:
            if cuda:
                comm.wait_stream(compute)  # K, V arrived; K_next, V_next no longer read
            with torch.cuda.stream(comm) if cuda else contextlib.nullcontext():
                if cuda:
                    ev["comm_start"].record()
                reqs = dist.batch_isend_irecv(
                    [
                        dist.P2POp(dist.isend, K, send_to, group),
                        dist.P2POp(dist.isend, V, send_to, group),
                        dist.P2POp(dist.irecv, K_next, recv_from, group),
                        dist.P2POp(dist.irecv, V_next, recv_from, group),
                    ]
                )
        if cuda:
            ev["compute_start"].record(compute)
        done = 0
        for qs, ks, m in _calls(block_runs[rank], block_runs[b], causal, own=b == rank):
            O_p, lse_p = attend(
                q[..., qs, :], K[..., ks, :], V[..., ks, :], causal=m == "diagonal", scale=scale
            )  # (..., nq, dv), (..., nq)
            O[..., qs, :], lse[..., qs] = merge(O[..., qs, :], lse[..., qs], O_p, lse_p)
            nq, nk = O_p.shape[-2], K[..., ks, :].shape[-2]
            done += nq * (nq + 1) // 2 if m == "diagonal" else nq * nk
        pairs.append(done)
        if cuda:
            ev["compute_end"].record(compute)
        if moves:
            with torch.cuda.stream(comm) if cuda else contextlib.nullcontext():
                for req in reqs:
                    req.wait()  # NCCL: the comm stream waits; gloo: this thread waits
                if cuda:
                    ev["comm_end"].record()
            if cuda:
                compute.wait_stream(comm)
            K, V, K_next, V_next = K_next, V_next, K, V
        if timings is not None and cuda:
            timings.append(ev)
    return O.to(q.dtype), lse, pairs


def _global(group, rank: int) -> int:
    """The global rank of ``group``'s rank ``rank`` (P2POp takes global peers)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def flash_attend_from_cpu(q, k, v, *, causal, scale):
    """``flash_attend`` on GPU 0 for CPU tensors: the kernel inside a gloo ring on one GPU."""
    device = torch.device("cuda", 0)
    O, lse = flash_attend(*(x.to(device) for x in (q, k, v)), causal=causal, scale=scale)
    return O.cpu(), lse.cpu()


_EVENTS = ("comm_start", "comm_end", "compute_start", "compute_end")


def step_times(timings) -> list[dict]:
    """Milliseconds per step from ``ring_forward``'s events (call after a synchronise).

    ``compute_ms``: the local kernels and merges; ``comm_ms``: from issuing the transfer to
    its end; ``exposed_ms``: how long the transfer outlasted the compute (the compute stream
    waited that long); ``hidden``: the fraction of ``comm_ms`` that overlapped compute.
    """
    out = []
    for ev in timings:
        row = {"compute_ms": ev["compute_start"].elapsed_time(ev["compute_end"])}
        if "comm_start" in ev:  # every step but the last sends a block
            comm = ev["comm_start"].elapsed_time(ev["comm_end"])
            exposed = max(0.0, ev["compute_end"].elapsed_time(ev["comm_end"]))
            hidden = 1.0 - exposed / comm if comm > 0 else 1.0
            row.update(comm_ms=comm, exposed_ms=exposed, hidden=min(1.0, max(0.0, hidden)))
        out.append(row)
    return out
