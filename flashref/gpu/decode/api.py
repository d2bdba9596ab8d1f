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
every token, so the checks of those are kept per call signature
(``flashref.gpu.decode.check_memo``); ``lengths`` and ``block_table`` are checked on every call.

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
from .check_memo import CheckMemo
from .checks import (
    HEAD_DIMS,
    MAX_NQ,
    check_arrays,
    check_block_table,
    check_common,
    check_device,
    check_device_ints,
    check_kind,
    check_lengths,
    check_page_size,
    is_device_array,
)
from .launch import DirectDecode, launch
from .versions import (
    BC,
    BLOCKS_PER_SM,
    DEFAULT_VERSION,
    MAX_GRID,
    MAX_SPLITS,
    MIN_TILES_PER_SPLIT,
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


@functools.lru_cache(maxsize=1024, typed=True)  # typed: True and 1 are not the same B
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


_DIRECT = _host.Kept()  # call signature -> DirectDecode (device tables or none)


def _direct_key(arrays, tables, scalars):
    """``_host.signature`` of a call whose tables are on the device (or absent); None where a
    table is on the host (its values are checked on every call)."""
    if any(t is not None and not is_device_array(t) for t in tables):
        return None
    return _host.signature((*arrays, *tables), scalars)


def _run(
    q,
    k,
    v,
    bt,
    lengths,
    names,
    *,
    Hkv,
    page_size,
    max_pages,
    Nk,
    num_splits,
    lse,
    version,
    key=None,
    **kw,
):
    cp = require_gpu()
    b = _host.backend_of(cp, tuple(zip(("q", *names), (q, k, v), strict=True)))
    for name, x in (("block_table", bt), ("lengths", lengths)):
        if x is not None and is_device_array(x) and (b.kind == "torch") != _host.is_torch(x):
            raise TypeError(
                f"{name} is a {type(x).__module__.split('.')[0]} array but q is a "
                f"{b.kind} one; pass device tables of q's kind, or host arrays"
            )
        if x is not None and b.kind == "torch" and _host.is_torch(x):
            _host.check_torch_tensors((("q", q), (name, x)))
    from .._launch import device_facts

    with _host.device_scope(cp, b.device):
        cc, name, sms = device_facts()  # asked once per device
        if version is None:  # this GPU's default (a contiguous cache: bt is None)
            rows = k.shape[0] * k.shape[1] * k.shape[2]  # (pages or B) x Hkv x slots
            version = default_decode_version(cc, None if bt is None else page_size, rows)
        check_device(cc, version, f"this GPU ({name})")
        B, Hq, Nq, d = q.shape
        plan = decode_plan(max(B, 1), Hq, Hkv, Nq, Nk, d, sms, num_splits, version)  # B = 0: none
        if plan.grid[1] > MAX_GRID or B > MAX_GRID:
            raise ValueError(
                f"q {tuple(q.shape)} needs a grid {plan.grid}; at most {MAX_GRID} in y, z"
            )
        direct = None
        if all(x is None or is_device_array(x) for x in (bt, lengths)):
            call = DirectDecode(
                cp,
                b,
                q,
                k,
                bt,
                lengths,
                Hkv=Hkv,
                page_size=page_size,
                max_pages=max_pages,
                plan=plan,
                keep_lse=lse,
                **kw,
            )
            if call.usable:
                direct = _DIRECT.put(key, call)(q, k, v, bt, lengths)
    if direct is not None:
        O, L = direct
        return (O, L) if lse else O
    with b.scope():  # the general launch, CuPy operations on the backend's stream and memory
        qc, kc, vc = b.view(q), b.view(k), b.view(v)
        bt, lengths = (None if x is None else _int32_on_device(cp, b, x) for x in (bt, lengths))
        O, L = b.empty((B, Hq, Nq, d), q.dtype), b.empty((B, Hq, Nq), "float32")
        launch(
            cp,
            qc,
            kc,
            vc,
            bt,
            lengths,
            Hkv=Hkv,
            page_size=page_size,
            max_pages=max_pages,
            plan=plan,
            O=b.view(O),
            lse=b.view(L),
            fresh=b.kind == "torch",
            **kw,
        )
    return (O, L) if lse else O


def _int32_on_device(cp, b, x):
    """``x`` (checked: a host int32 array, or a device array of integers of q's kind) as a
    C-contiguous int32 CuPy array, copied or converted only where it must be (on the call's
    stream: inside the backend's scope)."""
    if not is_device_array(x):
        return cp.asarray(x)  # host values, checked: copied up
    xc = b.view(x)
    if xc.dtype != cp.int32:
        xc = xc.astype(cp.int32)
    return cp.ascontiguousarray(xc)


def _contiguous_checks(q, k, v, version, causal, scale, num_splits, return_lse):
    """``decode_attention``'s checks of everything but ``lengths``: (version, causal, scale,
    num_splits) as the call uses them. Kept per signature (``_CONTIGUOUS_CHECKS``)."""
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


# the checks above depend only on the arrays' types, shapes and dtypes and on the options
_CONTIGUOUS_CHECKS = CheckMemo(_contiguous_checks)
_PAGED_CHECKS = CheckMemo(_paged_checks)


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
    options = ("contiguous", causal, scale, num_splits, return_lse, version)
    key = _direct_key((q, k, v), (lengths,), options)
    call = _DIRECT.get(key) if key is not None else None
    if call is not None:  # this signature was checked and planned: launch
        out = call(q, k, v, None, lengths)
        if out is not None:
            return out if return_lse else out[0]
    version, causal, scale, num_splits = _CONTIGUOUS_CHECKS(
        (q, k, v), (version, causal, scale, num_splits, return_lse)
    )
    B, Nk = q.shape[0], k.shape[2]
    if lengths is None:
        L = None
    elif is_device_array(lengths):  # stays on the device: shape and dtype checked, values not read
        check_device_ints(lengths, "lengths", (B,), f"({B},), one per sequence of q")
        L = lengths
    else:
        L = check_lengths(lengths, B, Nk, f"k has Nk = {Nk} keys")
    return _run(
        q,
        k,
        v,
        None,
        L,
        ("k", "v"),
        Hkv=k.shape[1],
        page_size=Nk,
        max_pages=1,
        Nk=Nk,
        causal=causal,
        scale=scale,
        num_splits=num_splits,
        lse=return_lse,
        version=version,
        key=key,
    )


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
    options = ("paged", causal, scale, num_splits, return_lse, version)
    key = _direct_key((q, k_pages, v_pages), (block_table, lengths), options)
    call = _DIRECT.get(key) if key is not None else None
    if call is not None:  # this signature was checked and planned: launch
        out = call(q, k_pages, v_pages, block_table, lengths)
        if out is not None:
            return out if return_lse else out[0]
    version, causal, scale, num_splits = _PAGED_CHECKS(
        (q, k_pages, v_pages), (version, causal, scale, num_splits, return_lse)
    )
    (B, *_), (P, Hkv, ps, _) = q.shape, k_pages.shape
    on_device = is_device_array(block_table), is_device_array(lengths)
    if any(on_device):  # read where they are: shapes and dtypes checked, values not read
        for ok, name in zip(on_device, ("block_table", "lengths"), strict=True):
            if not ok:
                raise TypeError(
                    f"{name} is a host array but the other table is on the device; give "
                    "block_table and lengths both on the device (read there) or both on "
                    "the host (every value checked)"
                )
        check_device_ints(block_table, "block_table", (B, None), f"({B}, max_pages)")
        check_device_ints(lengths, "lengths", (B,), f"({B},), one per sequence of q")
        bt, L = block_table, lengths
        Nk_max = bt.shape[1] * ps  # the most keys the table can hold: the split count's Nk
    else:
        bt, L = check_block_table(block_table, lengths, B, P, ps)
        Nk_max = int(L.max()) if B else 0
    return _run(
        q,
        k_pages,
        v_pages,
        bt,
        L,
        ("k_pages", "v_pages"),
        Hkv=Hkv,
        page_size=ps,
        max_pages=bt.shape[1],
        Nk=Nk_max,
        causal=causal,
        scale=scale,
        num_splits=num_splits,
        lse=return_lse,
        version=version,
        key=key,
    )


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
