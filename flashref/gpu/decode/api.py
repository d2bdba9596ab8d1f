"""Split-KV decoding on the GPU: a few queries per sequence against a long (paged) K/V cache.

``flashref.split_kv_attention`` and ``flashref.paged_attention`` as one CUDA kernel
(``flashref/kernels/decode/v01_split_kv.cu``) and a small combine kernel:

    O = decode_attention(q, k, v, lengths=lengths)          # k, v (B, Hkv, Nk, d)
    O = paged_decode_attention(q, k_pages, v_pages, block_table, lengths)

``q (B, Hq, Nq, d)`` with ``1 <= Nq <= 16`` and ``Hq`` a multiple of ``Hkv`` (grouped-query
attention: query head ``h`` uses K/V head ``h // (Hq // Hkv)``); float16 or bfloat16 CuPy
arrays or torch CUDA tensors; ``d`` 64 or 128. ``causal`` is spelled as everywhere
(``flashref._checks.check_causal``); these kernels mask bottom-right (query ``i`` of a
sequence of length ``L`` sees keys ``j <= i + L - Nq``: the queries are its newest tokens),
so they take ``"bottom_right"`` or ``False`` and refuse the top-left mask (``True``,
``"top_left"``), as ``flashref.paged_attention`` does.
``lengths (B,)`` integers give each sequence's number of valid keys (0 allowed: zeros and
``lse = -inf``). Arguments are checked before any GPU work, with the messages of the CPU
functions; ``lengths`` and ``block_table`` are read on the host for that (they are small).

The keys of every sequence are cut into ``num_splits`` chunks of whole 64-key tiles, one
thread block per (chunk, K/V head, sequence); ``choose_num_splits`` picks the count from the
shape and the number of SMs, ``decode_plan`` shows the whole launch and
``flashref.gpu.decode.launch`` runs it. A decode loop repeats its call's shapes and options
every token, so a call is planned once per call signature (``DecodeCall``, kept as the forward's
and backward's plans are: ``flashref.gpu._host``) and run every call; host ``lengths`` and
``block_table`` have their values checked on every call.

The kernel versions, their files and launch constants are in ``flashref.gpu.decode.versions``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..._checks import check_block, check_shapes, group_size
from ...kvcache import PagedKVCache
from .. import _host
from .._runtime import require_gpu
from .checks import (
    HEAD_DIMS,
    MAX_NQ,
    check_arrays,
    check_block_table,
    check_common,
    check_device,
    check_kind,
    check_lengths,
    check_page_size,
    tables_on_device,
)
from .launch import int32s, kernels, launch, split_scalars
from .versions import (
    BC,
    BLOCKS_PER_SM,
    DEFAULT_VERSION,
    MAX_GRID,
    MAX_SPLITS,
    MIN_TILES_PER_SPLIT,
    SM90A_VERSIONS,
    TILE_KEYS,
    VERSIONS,
    check_splits,
    check_version,
    default_decode_version,
    smem_bytes,
    split_blocks_per_sm,
    threads,
)


def row_tiles(G: int, Nq: int) -> tuple[int, int]:
    """``(row_tiles, row_blocks)``: the ``G * Nq`` packed rows of a K/V head, 16 per tile.

    One block holds 16 or 32 rows (1 or 2 tiles of mma.sync's M = 16); more rows than that
    take several row blocks, each of which reads the K/V head again (from L2, mostly).
    """
    M = G * Nq
    tiles = 1 if M <= 16 else 2
    return tiles, -(-M // (16 * tiles))


def choose_num_splits(
    B: int,
    Hkv: int,
    Nk: int,
    sm_count: int,
    *,
    row_blocks: int = 1,
    blocks_per_sm: int = BLOCKS_PER_SM,
) -> int:
    """How many chunks to cut the keys into, from the shape and the GPU's SM count.

    ``B * Hkv * row_blocks`` blocks exist without splitting; ``sm_count * blocks_per_sm``
    slots are filled at once. Each split count ``S`` from 1 to
    ``min(MAX_SPLITS, tiles / MIN_TILES_PER_SPLIT)`` gives ``waves = blocks * S / slots``;
    its efficiency is ``waves / ceil(waves)`` (the last wave's idle slots are waste). The
    smallest ``S`` within 5% of the best efficiency wins: fewer splits, less combine work,
    for the same occupancy. A batch that fills the GPU gets 1.
    ``blocks_per_sm`` (default ``BLOCKS_PER_SM``): the blocks per SM to fill
    (``split_blocks_per_sm`` of the version).
    """
    B, Hkv = check_block(B, "B"), check_block(Hkv, "Hkv")
    Nk, sm_count = check_block(Nk, "Nk", minimum=0), check_block(sm_count, "sm_count")
    row_blocks = check_block(row_blocks, "row_blocks")
    blocks_per_sm = check_block(blocks_per_sm, "blocks_per_sm")
    blocks, slots = B * Hkv * row_blocks, sm_count * blocks_per_sm
    tiles = -(-Nk // BC)
    top = max(1, min(MAX_SPLITS, tiles // MIN_TILES_PER_SPLIT))
    eff = [(w := blocks * S / slots) / math.ceil(w) for S in range(1, top + 1)]
    best = max(eff)
    return next(S for S, e in enumerate(eff, start=1) if e >= 0.95 * best)


@dataclass(frozen=True)
class DecodePlan:
    """How a decode call is launched: shown by ``decode_plan``, used by the launch."""

    num_splits: int
    row_tiles: int  # 16-row tiles per block (1 or 2)
    row_blocks: int  # blocks per K/V head along the packed rows
    grid: tuple[int, int, int]  # (num_splits, Hkv * row_blocks, B)
    threads: int
    smem_bytes: int
    version: int = DEFAULT_VERSION


def decode_plan(
    B, Hq, Hkv, Nq, Nk, d, sm_count, num_splits=None, version=DEFAULT_VERSION
) -> DecodePlan:
    """The launch of ``decode_attention`` for this shape on a GPU of ``sm_count`` SMs.

    Kept per argument tuple (a plan is frozen): a decode step repeats its shape every call,
    and the split search costs more host time than a short kernel runs. Every argument is
    checked as the entry points check it, each error naming the one that is wrong:
    counts are ints (not bools) of at least 1 (``Nk`` 0 allowed), ``1 <= Nq <= 16``,
    ``d`` 64 or 128, ``num_splits`` None or an int in ``1..MAX_SPLITS`` for the versions
    that merge in registers.
    """
    args = (B, Hq, Hkv, Nq, Nk, d, sm_count, num_splits, version)
    try:
        hash(args)
    except TypeError:  # a list or an array where a count goes: the checks name it
        return _checked_plan(*args)
    return _kept_plan(*args)


def _checked_plan(B, Hq, Hkv, Nq, Nk, d, sm_count, num_splits, version) -> DecodePlan:
    version = check_version(version)
    B, Hq, Hkv = check_block(B, "B"), check_block(Hq, "Hq"), check_block(Hkv, "Hkv")
    Nq, Nk = check_block(Nq, "Nq"), check_block(Nk, "Nk", minimum=0)
    sm_count = check_block(sm_count, "sm_count")
    if Nq > MAX_NQ:
        raise ValueError(f"Nq is {Nq}; the decode kernel takes 1 <= Nq <= {MAX_NQ} queries")
    if check_block(d, "d") not in HEAD_DIMS:
        raise ValueError(f"d is {d!r}; the decode kernel supports d in {HEAD_DIMS}")
    if num_splits is not None:
        num_splits = check_block(num_splits, "num_splits")
    G = group_size(Hq, Hkv, kv="k")
    tiles, blocks = row_tiles(G, Nq)
    if num_splits is None:
        per_sm = split_blocks_per_sm(version, d, tiles)
        num_splits = choose_num_splits(
            B, Hkv, Nk, sm_count, row_blocks=blocks, blocks_per_sm=per_sm
        )
    check_splits(num_splits, version)
    grid = (num_splits, Hkv * blocks, B)
    smem = smem_bytes(d, tiles, version)
    return DecodePlan(num_splits, tiles, blocks, grid, threads(version), smem, version)


# typed: True and 1 are not the same B
_kept_plan = functools.lru_cache(maxsize=1024, typed=True)(_checked_plan)


def _contiguous_checks(q, k, v, version, causal, scale, num_splits, return_lse):
    """``decode_attention``'s checks of everything but ``lengths``: (version, causal, scale,
    num_splits) as the call uses them."""
    version = check_version(version)
    check_arrays(q, k, v, "k", "v")
    check_shapes(q, k, v)  # the CPU functions' shape rules and messages (GQA included)
    _, d = check_kind(q, k, v, "k", "v")
    causal, scale, num_splits = check_common(causal, scale, num_splits, return_lse, d)
    check_splits(num_splits, version)
    B, Nk = q.shape[0], k.shape[2]
    check_page_size(BC, B * k.shape[1] * Nk, version, f"k {tuple(k.shape)}")  # B pages of Nk
    return version, causal, scale, num_splits


def _paged_checks(q, k_pages, v_pages, version, causal, scale, num_splits, return_lse):
    """``paged_decode_attention``'s checks of everything but the block table and lengths."""
    version = check_version(version)
    check_arrays(q, k_pages, v_pages, "k_pages", "v_pages")
    if tuple(v_pages.shape) != tuple(k_pages.shape):
        raise ValueError(
            f"v_pages has shape {tuple(v_pages.shape)} but k_pages {tuple(k_pages.shape)}"
        )
    P, Hkv, ps, _ = k_pages.shape
    group_size(q.shape[1], Hkv, f" (q {tuple(q.shape)}, k_pages {tuple(k_pages.shape)})", "k_pages")
    if k_pages.shape[3] != q.shape[3]:
        raise ValueError(
            f"k_pages has shape {tuple(k_pages.shape)} but q has head dim {q.shape[3]}"
        )
    _, d = check_kind(q, k_pages, v_pages, "k_pages", "v_pages")
    causal, scale, num_splits = check_common(causal, scale, num_splits, return_lse, d)
    check_splits(num_splits, version)
    check_page_size(ps, P * Hkv * ps, version, f"k_pages {tuple(k_pages.shape)}")
    return version, causal, scale, num_splits


_PLANS = _host.Kept()  # call signature -> DecodeCall


class DirectDecode(_host.Plan):
    """A decode call signature ready to launch with the arrays' addresses (``__call__``):
    the compiled kernels, grid, scalar arguments and shapes made once, so that a call checks
    that its arrays are contiguous and aligned, allocates ``O``, ``lse`` (and the partials of
    ``S > 1`` splits) from the backend ``b`` (``flashref.gpu._host``: torch's graph-aware
    allocator, or CuPy's pool) and launches on the backend's stream.

    ``keep_lse=False`` (the caller returns only ``O``): a call returns ``(O, None)``, its lse
    written after the partials in their one allocation (with ``S > 1``), one allocation less.

    ``usable`` is False where the general ``launch`` must run every call: a negative scale
    (q's sign is flipped first), versions 4 and 5 (their arrival counters), tables not int32.
    """

    def __init__(
        self,
        cp,
        b,
        q,
        K,
        bt,
        lengths,
        *,
        Hkv,
        page_size,
        max_pages,
        causal,
        scale,
        plan,
        keep_lse=True,
    ):
        tables = tuple(x for x in (bt, lengths) if x is not None)
        self.usable = (
            scale > 0
            and VERSIONS[plan.version].combine_kernel is not None
            and all(str(x.dtype).removeprefix("torch.") == "int32" for x in tables)
        )
        if not self.usable:
            return
        super().__init__(cp, b)
        B, Hq, Nq, d = q.shape
        self.plan, self.d = plan, d
        self.dtype = str(q.dtype).removeprefix("torch.")
        self.q_dtype = q.dtype
        self.o_shape, self.lse_shape = (B, Hq, Nq, d), (B, Hq, Nq)
        self.S, self.rows = plan.num_splits, B * Hq * Nq
        self.fns = kernels(cp, d, plan.row_tiles, self.dtype, plan.smem_bytes, plan.version)
        self.consts = split_scalars(Hq, Hkv, Nq, page_size, max_pages, float(scale), bool(causal))
        self.combine_grid = ((self.rows + 3) // 4, 1, 1)
        self.grid, self.block = plan.grid, (plan.threads, 1, 1)
        self.combine_ints = int32s(self.rows, self.S)
        self.ws_shape = (self.rows * self.S * (d + 1),)
        self.keep_lse = keep_lse  # False: lse goes in the partials' allocation (S > 1)
        self.ws_bytes = self.ws_shape[0] * 4
        self.ws_lse_shape = (self.ws_shape[0] + self.rows,)
        self.lse_offset = self.rows * self.S * d * 4  # bytes: buffers.views' layout
        self.tma = plan.version in SM90A_VERSIONS
        if self.tma:
            from .._launch import tensor_map_ptr

            self.map_of = tensor_map_ptr  # the cached TMA descriptors (bytes)
        self.kv_rows = K.shape[0] * K.shape[1] * K.shape[2]
        self.empty = B == 0

    def __call__(self, q, K, V, bt, lengths):
        """``(O, lse)`` (``lse`` None unless kept), or None where an array must be copied first
        (the general route)."""
        b = self.backend
        ptrs = self.addresses((q, K, V, bt, lengths), (16, 16, 16, 4, 4))
        if ptrs is None:
            return None
        qp, kp, vp, bt_p, len_p = ptrs  # a table not given: a null pointer
        O = b.empty(self.o_shape, self.q_dtype)
        if self.keep_lse or self.S == 1 or self.empty:
            lse = b.empty(self.lse_shape, "float32")
            ws = b.empty(self.ws_shape, "float32") if self.S > 1 and not self.empty else None
            Lp = b.ptr(lse)
        else:  # lse is not returned: it lives after the partials, in their allocation
            lse = None
            ws = b.empty(self.ws_lse_shape, "float32")
            Lp = b.ptr(ws) + self.ws_bytes
        if self.empty:
            return O, lse
        Op = b.ptr(O)
        if self.S > 1:
            Opart = b.ptr(ws)
            Lpart = Opart + self.lse_offset
        else:
            Opart, Lpart = Op, Lp
        self.launch_at(qp, kp, vp, bt_p, len_p, Op, Lp, Opart, Lpart, b.stream_ptr())
        return O, lse

    def launch_at(self, qp, kp, vp, bt_p, len_p, Op, Lp, Opart, Lpart, stream) -> None:
        """The kernels on the arrays at these addresses (checked by the caller), on the stream
        of handle ``stream``: ``Opart``, ``Lpart`` the partials of ``S > 1`` splits (with
        ``S == 1``, ``Op`` and ``Lp`` themselves). What ``flashref.gpu.decode.plan`` replays."""
        split_fn, combine_fn = self.fns
        maps = ()
        if self.tma:  # K and V as (rows, d), boxes of TILE_KEYS rows
            map_of, n, d, dt, dev = self.map_of, self.kv_rows, self.d, self.dtype, self.device
            maps = (map_of(kp, n, d, dt, TILE_KEYS, dev), map_of(vp, n, d, dt, TILE_KEYS, dev))
        split_args = (qp, kp, vp, bt_p, len_p, Op, Lp, Opart, Lpart, *self.consts, *maps)
        combine_args = (Opart, Lpart, Op, Lp, *self.combine_ints)
        with self.on_device():  # the kernels are this device's
            self.launch(split_fn, self.grid, self.block, self.plan.smem_bytes, stream, split_args)
            if self.S > 1:
                self.launch(combine_fn, self.combine_grid, (128, 1, 1), 0, stream, combine_args)


class DecodeCall(_host.Plan):
    """A decode call signature, checked and planned once (``_PLANS``, keyed by
    ``_host.signature`` of the arrays, the tables and the options). Made in two halves: the
    checks, which need no GPU (the options, the version asked for, where the tables are),
    and at the first run the GPU's (``prepare``: the backend, the device's facts and
    default version; with device tables or none, the launch itself, ``DirectDecode``:
    kernels, grid, scalar arguments). ``run`` checks only the values of host tables, then
    launches."""

    def __init__(self, paged: bool, arrays, tables, options):
        q, k, v = arrays
        bt, lengths = tables
        causal, scale, num_splits, return_lse, version = options
        check = _paged_checks if paged else _contiguous_checks
        version, causal, scale, num_splits = check(
            q, k, v, version, causal, scale, num_splits, return_lse
        )
        B, Hq, Nq, d = q.shape
        self.device_tables = tables_on_device(paged, bt, lengths, B)
        self.paged, self.version, self.return_lse = paged, version, return_lse
        self.shape, self.num_splits = (B, Hq, Nq, d), num_splits
        self.pool = tuple(k.shape)  # (pages, Hkv, page_size, d): a contiguous cache, B x Nk
        self.kw = {"Hkv": k.shape[1], "page_size": k.shape[2], "causal": causal, "scale": scale}
        self.backend = self.direct = self.plan = None  # the GPU's half: prepare

    def prepare(self, q, k, v, bt, lengths) -> None:
        """The GPU's half of the plan, made at the first run (after the checks)."""
        names = ("k_pages", "v_pages") if self.paged else ("k", "v")
        cp = require_gpu()
        b = _host.backend_of(cp, (("q", q), (names[0], k), (names[1], v)))
        if self.device_tables:
            _host.check_tables(b, q, (("block_table", bt), ("lengths", lengths)))
        from .._launch import device_facts

        with _host.device_scope(cp, b.device):  # the kernels are compiled for b's device
            cc, name, sms = device_facts()  # asked once per device
            P, Hkv, ps, _ = self.pool
            version = self.version
            if version is None:  # this GPU's default
                version = default_decode_version(cc, ps if self.paged else None, P * Hkv * ps)
                if self.paged:
                    check_page_size(ps, P * Hkv * ps, version, f"k_pages {self.pool}")
            check_device(cc, version, f"this GPU ({name})")
            self.version, self.sms = version, sms
            if self.device_tables:
                max_pages = bt.shape[1] if self.paged else 1
                plan = self.decode_plan(max_pages * ps)  # the table's capacity
                direct = DirectDecode(
                    cp,
                    b,
                    q,
                    k,
                    bt,
                    lengths,
                    max_pages=max_pages,
                    plan=plan,
                    keep_lse=self.return_lse,
                    **self.kw,
                )
                self.plan, self.direct = plan, direct if direct.usable else None
        super().__init__(cp, b)  # last: a plan with a backend is ready

    def decode_plan(self, Nk: int) -> DecodePlan:
        """The ``DecodePlan`` of ``Nk`` keys (the split count's), checked against the grid."""
        B, Hq, Nq, d = self.shape
        Hkv, S = self.kw["Hkv"], self.num_splits
        plan = decode_plan(max(B, 1), Hq, Hkv, Nq, Nk, d, self.sms, S, self.version)
        if plan.grid[1] > MAX_GRID or B > MAX_GRID:
            raise ValueError(f"q {self.shape} needs a grid {plan.grid}; at most {MAX_GRID} in y, z")
        return plan

    def run(self, q, k, v, bt, lengths):
        """``(O, lse)`` of this signature's arrays (``lse`` None where it is not returned and
        lives in the partials' allocation)."""
        if self.direct is not None:
            out = self.direct(q, k, v, bt, lengths)
            if out is not None:
                return out
        Nk, ps = None, self.kw["page_size"]
        if not self.device_tables:  # host tables: every value checked, every call
            B = self.shape[0]
            if self.paged:
                bt, lengths = check_block_table(bt, lengths, B, self.pool[0], ps)
                Nk = int(lengths.max()) if B else 0
            else:
                lengths, Nk = check_lengths(lengths, B, ps, f"k has Nk = {ps} keys"), ps
        if self.backend is None:
            self.prepare(q, k, v, bt, lengths)
            if self.direct is not None:
                out = self.direct(q, k, v, bt, lengths)
                if out is not None:
                    return out
        plan = self.plan if Nk is None else self.decode_plan(Nk)
        b, cp = self.backend, self.cp
        with b.scope():  # the general launch, CuPy operations on the backend's stream and memory
            qc, kc, vc = b.view(q), b.view(k), b.view(v)
            tables = []
            for x in (bt, lengths):
                if x is not None:
                    x = b.view(x) if self.device_tables else cp.asarray(x)  # host: copied up
                    if x.dtype != cp.int32:
                        x = x.astype(cp.int32)
                    x = cp.ascontiguousarray(x)
                tables.append(x)
            O, L = b.empty(self.shape, q.dtype), b.empty(self.shape[:3], "float32")
            launch(
                cp,
                qc,
                kc,
                vc,
                *tables,
                max_pages=1 if bt is None else bt.shape[1],
                plan=plan,
                O=b.view(O),
                lse=b.view(L),
                fresh=b.kind == "torch",
                **self.kw,
            )
        return O, L


def _call(paged: bool, arrays, tables, options):
    key = _host.signature((*arrays, *tables), (paged, *options))
    call = _PLANS.get(key)
    if call is None:
        call = _PLANS.put(key, DecodeCall(paged, arrays, tables, options))
    O, lse = call.run(*arrays, *tables)
    return (O, lse) if options[3] else O


def decode_attention(
    q,
    k,
    v,
    *,
    lengths=None,
    causal=False,
    scale=None,
    num_splits=None,
    return_lse=False,
    version=None,
):
    """Attention of ``Nq <= 16`` queries per sequence to a contiguous K/V cache, split-KV.

    Args:
        q: ``(B, Hq, Nq, d)``; k, v: ``(B, Hkv, Nk, d)``, ``Hq`` a multiple of ``Hkv``.
        lengths: optional integers ``(B,)``, ``0 <= lengths[b] <= Nk``: sequence ``b`` uses
            keys ``0 .. lengths[b] - 1`` (default: all ``Nk``). A host array has every value
            checked; a device array (CuPy, CUDA tensor) is read by the kernel where it is, no
            copy and no synchronisation, its shape and dtype checked and its values not.
        causal: ``False`` (default: every key of the sequence, as ``flash_attention``'s
            default; with ``Nq = 1`` the same as bottom-right) or ``"bottom_right"``; the
            top-left mask (``True``) is refused.
        scale: default ``1/sqrt(d)``; num_splits: default ``choose_num_splits``.
        return_lse: also return ``lse (B, Hq, Nq)`` in float32.
        version: the kernel version, a key of ``VERSIONS`` (all give the same results), or
            None (default) for ``default_decode_version`` of this GPU.

    Returns ``O (B, Hq, Nq, d)`` in q's dtype, or ``(O, lse)``; torch tensors if q is one.
    """
    options = (causal, scale, num_splits, return_lse, version)
    return _call(False, (q, k, v), (None, lengths), options)


def paged_decode_attention(
    q,
    k_pages,
    v_pages,
    block_table,
    lengths,
    *,
    causal="bottom_right",
    scale=None,
    num_splits=None,
    return_lse=False,
    version=None,
):
    """``decode_attention`` reading K/V pages through a block table (``PagedKVCache``'s layout).

    Args:
        q: ``(B, Hq, Nq, d)``; k_pages, v_pages: ``(num_pages, Hkv, page_size, d)``.
        block_table: integers ``(B, max_pages)``; sequence ``b``'s key ``t`` is in page
            ``block_table[b, t // page_size]``, slot ``t % page_size``; entries past the pages
            in use are not read (``PagedKVCache.block_table`` fills them with -1).
        lengths: integers ``(B,)``, ``0 <= lengths[b] <= max_pages * page_size``.
        causal: ``"bottom_right"`` (default, as ``flashref.paged_attention``: a paged cache
            holds the sequences being generated, and its new queries are their newest
            tokens, which must not see later ones) or ``False``; the top-left mask
            (``True``) is refused.
        scale, num_splits, return_lse, version: as ``decode_attention``.

    ``block_table`` and ``lengths`` given as device arrays (both) are read by the kernel where
    they are, with no copy and no synchronisation (so that a CUDA graph replays the call with
    the tables' new values): their shapes and dtypes are checked, their values are not, and
    the split count is planned for the table's capacity (``max_pages * page_size`` keys).
    Given as host arrays, every value is checked and the tables are copied to the device.
    """
    options = (causal, scale, num_splits, return_lse, version)
    return _call(True, (q, k_pages, v_pages), (block_table, lengths), options)


def cache_decode_attention(q, cache, seqs, **kwargs):
    """``paged_decode_attention`` on a ``flashref.PagedKVCache`` whose pools are on the GPU.

    Move the pools once (``cache.k_pages = cupy.asarray(cache.k_pages)``, the same for
    ``v_pages``); ``cache.block_table(seqs)`` gives the table and lengths, as on the CPU.
    Keyword arguments are those of ``paged_decode_attention``.
    """

    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    table, lengths = cache.block_table(seqs)  # (B, max_pages), (B,): checks every id
    return paged_decode_attention(q, cache.k_pages, cache.v_pages, table, lengths, **kwargs)
