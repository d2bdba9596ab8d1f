"""Chunked prefill: a prompt's queries attend to a paged cache, causal bottom-right.

A serving engine writes a long prompt into its paged cache a chunk at a time, so that one
prompt does not hold up the decode steps of the other sequences for long: each chunk's keys
and values are appended first (``DevicePagedKVCache.begin_step`` and ``append``), then its
queries attend to every key of their sequence so far, the earlier chunks' and their own:

    O = paged_prefill_attention(q, k_pages, v_pages, block_table, lengths)

``q (B, Hq, Nq, d)``: the newest ``Nq`` tokens of each sequence (any ``Nq``); the pools,
block table and lengths as ``paged_decode_attention`` takes them (``Hq`` a multiple of
``Hkv``: grouped heads read their K/V head's pages). Query ``i`` of sequence ``b`` sits at
position ``lengths[b] - Nq + i`` and sees keys ``j <= i + lengths[b] - Nq`` (``causal=
"bottom_right"``, the default; ``False``: every key of the sequence). Every sequence must
hold at least ``Nq`` keys (its chunk appended). The kernel
(``flashref/kernels/decode/paged_prefill.cu``) is version 29's loop with K and V read
through the block table, so it runs where version 29 runs: compute capability 9.0 (sm_90a),
d 64 or 128, float16 or bfloat16, page sizes a multiple of 64.

A chunk of few query blocks has fewer work tiles (query block, head) than the GPU has SMs:
512 queries of 16 heads are 64 tiles for 132 SMs. Then each query block's keys are split
among ``splits`` work tiles (at least two key tiles each), and a second kernel merges a row's
splits by their log-sum-exp, as the decode kernels do (chapter 10). ``splits=None`` (the
default) takes as many as fill the SMs once: ``SMs // (query blocks x B x Hq)``, at most
``MAX_SPLITS`` and half the key tiles of the longest sequence the table can hold.
"""

from __future__ import annotations

import numpy as np

from ..._checks import causal_bottom_right, check_flag, check_scale, group_size
from .. import _host
from .._runtime import require_gpu
from ..registry import DTYPE_DEFINES, KERNEL_DIR, paste_includes
from .checks import (
    DTYPES,
    HEAD_DIMS,
    check_arrays,
    check_block_table,
    tables_on_device,
)

BR, BC, STAGES, THREADS = 128, 128, 3, 384  # version 29's tiles, ring and block
KERNEL, COMBINE = "paged_prefill", "paged_prefill_combine"
MAX_SPLITS = 16


def default_splits(work_tiles: int, key_tiles: int, sms: int) -> int:
    """Key splits per query block: enough that the work tiles fill the SMs once (no more),
    each split at least two key tiles of the longest sequence, at most MAX_SPLITS."""
    return max(1, min(MAX_SPLITS, sms // max(work_tiles, 1), key_tiles // 2))


def smem_bytes(d: int) -> int:
    """Q (Br, d), the K and V rings (STAGES, Bc, d), 1 KiB of alignment: version 29's layout."""
    return 2 * (BR + 2 * STAGES * BC) * d + 1024


def _checks(q, k_pages, v_pages, causal, scale, return_lse, splits):
    check_arrays(q, k_pages, v_pages, "k_pages", "v_pages")
    if tuple(v_pages.shape) != tuple(k_pages.shape):
        raise ValueError(
            f"v_pages has shape {tuple(v_pages.shape)} but k_pages {tuple(k_pages.shape)}"
        )
    B, Hq, Nq, d = (int(x) for x in q.shape)
    P, Hkv, ps, dk = (int(x) for x in k_pages.shape)
    group_size(Hq, Hkv, f" (q {tuple(q.shape)}, k_pages {tuple(k_pages.shape)})", "k_pages")
    if dk != d:
        raise ValueError(f"k_pages has shape {tuple(k_pages.shape)} but q has head dim {d}")
    if Nq < 1:
        raise ValueError(f"q has {Nq} queries per sequence (shape {tuple(q.shape)}); at least 1")
    dtypes = {str(x.dtype).removeprefix("torch.") for x in (q, k_pages, v_pages)}
    if len(dtypes) != 1:
        raise TypeError(
            f"q, k_pages, v_pages must share one dtype; got {q.dtype}, {k_pages.dtype}, "
            f"{v_pages.dtype} (no implicit casts)"
        )
    dtype = dtypes.pop()
    if dtype not in DTYPES:
        raise TypeError(f"q has dtype {dtype}; paged_prefill_attention supports {DTYPES}")
    if d not in HEAD_DIMS:
        raise ValueError(f"q has head dim d={d}; paged_prefill_attention supports {HEAD_DIMS}")
    if ps % 64:
        raise ValueError(
            f"k_pages has page_size {ps} (shape {tuple(k_pages.shape)}); the prefill kernel "
            "loads boxes of 64 keys from one page: page_size must be a multiple of 64"
        )
    if P * Hkv * ps >= 2**31:
        raise ValueError(f"k_pages has {P * Hkv * ps} rows; the kernel addresses fewer than 2^31")
    causal = causal_bottom_right(causal, "paged_prefill_attention")
    check_flag(return_lse, "return_lse")
    if splits is not None:
        if isinstance(splits, bool) or not isinstance(splits, (int, np.integer)):
            raise TypeError(f"splits must be an int or None, got {type(splits).__name__}")
        if not 1 <= splits <= MAX_SPLITS:
            raise ValueError(f"splits={splits}; it must be in 1 .. {MAX_SPLITS} (or None)")
    return causal, check_scale(scale, d, "float32"), dtype


def paged_prefill_attention(
    q,
    k_pages,
    v_pages,
    block_table,
    lengths,
    *,
    causal="bottom_right",
    scale=None,
    return_lse=False,
    splits=None,
):
    """Attention of each sequence's newest ``Nq`` queries to its pages (see the module).

    Args:
        q: ``(B, Hq, Nq, d)``; k_pages, v_pages: ``(num_pages, Hkv, page_size, d)``.
        block_table, lengths: ``(B, max_pages)`` and ``(B,)`` integers, as
            ``paged_decode_attention`` takes them: host arrays have every value checked
            (and ``lengths >= Nq``), device arrays (int32, of q's kind) are read where they
            are, their values unchecked.
        causal: ``"bottom_right"`` (default) or ``False``; top-left (``True``) is refused.
        scale: default ``1/sqrt(d)``; return_lse: also return ``lse (B, Hq, Nq)`` float32.
        splits: key splits per query block, 1 .. ``MAX_SPLITS``; None (default): chosen to
            fill the SMs (see the module). A split with fewer than two key tiles of its
            sequence is left empty.

    Returns ``O (B, Hq, Nq, d)`` in q's dtype, or ``(O, lse)``; torch tensors if q is one.
    """

    arrays, tables = (q, k_pages, v_pages), (block_table, lengths)
    key = _host.signature((*arrays, *tables), (causal, scale, return_lse, splits))
    call = _PLANS.get(key)
    if call is None:
        call = _PLANS.put(key, PrefillCall(*arrays, *tables, causal, scale, return_lse, splits))
    O, lse = call.run(*arrays, *tables)
    return (O, lse) if return_lse else O


_PLANS = _host.Kept()  # call signature -> PrefillCall


class PrefillCall(_host.Plan):
    """A ``paged_prefill_attention`` call signature, checked once (``_PLANS``): the checks
    that need no GPU when made, the GPU's half (backend, device, compiled kernels) at the
    first run. ``run`` checks host tables' values on every call, then launches."""

    def __init__(self, q, k_pages, v_pages, block_table, lengths, causal, scale, lse, splits):
        self.causal, self.scale, self.dtype = _checks(
            q, k_pages, v_pages, causal, scale, lse, splits
        )
        self.shape, self.pool = tuple(int(x) for x in q.shape), tuple(int(x) for x in k_pages.shape)
        B = self.shape[0]
        self.device_tables = tables_on_device(True, block_table, lengths, B)
        if self.device_tables:
            for name, x in (("block_table", block_table), ("lengths", lengths)):
                if str(x.dtype).removeprefix("torch.") != "int32":
                    raise TypeError(f"{name} has dtype {x.dtype}; device tables must be int32")
        self.splits, self.backend = splits, None

    def prepare(self, q, k_pages, v_pages, block_table, lengths) -> None:
        """The GPU's half, at the first run: backend, device, compiled kernels."""
        cp = require_gpu()
        from .._launch import device_facts  # imports CuPy: after the checks and require_gpu

        names = (("q", q), ("k_pages", k_pages), ("v_pages", v_pages))
        b = _host.backend_of(cp, names)
        if self.device_tables:
            _host.check_tables(b, q, (("block_table", block_table), ("lengths", lengths)))
        with _host.device_scope(cp, b.device):  # the kernels are compiled for b's device
            cc, gpu, self.sms = device_facts()
            if tuple(cc) != (9, 0):
                raise RuntimeError(
                    f"paged_prefill_attention runs version 29's loop, built for sm_90a (wgmma, "
                    f"TMA): compute capability 9.0 exactly; this GPU ({gpu}) has {cc[0]}.{cc[1]}"
                )
            self.fns = kernels(cp, self.shape[3], self.dtype)
        super().__init__(cp, b)  # last: a plan with a backend is ready

    def run(self, q, k_pages, v_pages, bt, L):
        """``(O, lse)`` of this signature's arrays."""
        (B, Hq, Nq, d), (P, Hkv, ps, _) = self.shape, self.pool
        if self.device_tables:
            longest = int(bt.shape[1]) * ps  # the most the table can hold: lengths stay unread
        else:
            bt, L = check_block_table(bt, L, B, P, ps)
            longest = int(L.max()) if B else 0
            if B and int(L.min()) < Nq:
                b = int(np.argmin(L))
                raise ValueError(
                    f"lengths[{b}] is {int(L[b])} but q has Nq = {Nq} queries per sequence: "
                    "append the chunk's keys and values before its queries attend (lengths >= Nq)"
                )
        if self.backend is None:
            self.prepare(q, k_pages, v_pages, bt, L)
        cp, b, scale, dtype = self.cp, self.backend, self.scale, self.dtype
        with self.on_device(), b.scope():
            qc, kc, vc = (cp.ascontiguousarray(b.view(x)) for x in (q, k_pages, v_pages))
            if scale < 0:  # the kernel takes the row max of raw scores: flip q's sign instead
                qc, scale = -qc, -scale
            if not self.device_tables:
                bt, L = cp.asarray(bt), cp.asarray(L.astype(np.int32))
            btc, Lc = cp.ascontiguousarray(b.view(bt)), cp.ascontiguousarray(b.view(L))
            O = b.empty((B, Hq, Nq, d), q.dtype)
            lse = b.empty((B, Hq, Nq), "float32")
            if B == 0:
                return O, lse
            BH, Tr = B * Hq, -(-Nq // BR)
            S = self.splits or default_splits(Tr * BH, -(-longest // BC), self.sms)
            rows = P * Hkv * ps
            if S > 1:  # each split's O / l and lse, merged by the second kernel
                O_part = b.empty((BH * Nq, S, d), "float32")
                lse_part = b.empty((BH * Nq, S), "float32")
                parts = (b.ptr(O_part), b.ptr(lse_part))
            else:
                parts = (0, 0)
            from .._launch import tensor_map_ptr

            dev = self.device
            qmap = tensor_map_ptr(qc.data.ptr, BH * Nq, d, dtype, 64, dev)
            kmap = tensor_map_ptr(kc.data.ptr, rows, d, dtype, 64, dev)
            vmap = tensor_map_ptr(vc.data.ptr, rows, d, dtype, 64, dev)
            args = (
                qc.data.ptr,
                b.ptr(O),
                b.ptr(lse),
                btc.data.ptr,
                Lc.data.ptr,
                np.int32(Nq),
                np.int32(bt.shape[1] * ps),
                np.float32(scale),
                np.int32(bool(self.causal)),
                qmap,
                kmap,
                vmap,
                np.int32(BH),
                np.int32(Hq),
                np.int32(Hkv),
                np.int32(ps),
                np.int32(bt.shape[1]),
                np.int32(rows),
                np.int32(S),
                *parts,
            )
            fn, combine = self.fns
            stream = b.stream_ptr()
            grid = (min(Tr * BH * S, self.sms), 1, 1)
            self.launch(fn, grid, (THREADS, 1, 1), smem_bytes(d), stream, args)
            if S > 1:
                cargs = (*parts, b.ptr(O), b.ptr(lse), np.int32(BH * Nq), np.int32(S))
                self.launch(combine, (-(-BH * Nq // 4), 1, 1), (128, 1, 1), 0, stream, cargs)
        return O, lse


def source() -> str:
    """The kernel file's text with its includes pasted in, as NVRTC is given it."""
    return paste_includes(KERNEL_DIR / "decode" / "paged_prefill.cu")


def defines(d: int, dtype: str) -> tuple[str, ...]:
    """The defines of a (d, dtype) build (beside -arch=sm_90a)."""
    return (f"-DHEAD_DIM={d}", *DTYPE_DEFINES[dtype])


def kernels(cp, d: int, dtype: str):
    """The compiled kernel and its combine kernel for (d, dtype) on the current device (what
    a plan takes at its first run: ``flashref.bench prefill_stamps`` puts a stamped build here)."""
    from .._launch import compiled

    names = (KERNEL, COMBINE)
    options = ("-arch=sm_90a", *defines(d, dtype))
    return compiled(("prefill", d, dtype), source, options, names, {KERNEL: smem_bytes(d)})
