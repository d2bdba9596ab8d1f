"""Split-KV decoding on the GPU: a few queries per sequence against a long (paged) K/V cache.

``flashref.split_kv_attention`` and ``flashref.paged_attention`` as one CUDA kernel
(``flashref/kernels/decode_split_kv.cu``) and a small combine kernel:

    O = decode_attention(q, k, v, lengths=lengths)          # k, v (B, Hkv, Nk, d)
    O = paged_decode_attention(q, k_pages, v_pages, block_table, lengths)

``q (B, Hq, Nq, d)`` with ``1 <= Nq <= 16`` and ``Hq`` a multiple of ``Hkv`` (grouped-query
attention: query head ``h`` uses K/V head ``h // (Hq // Hkv)``); float16 or bfloat16 CuPy
arrays or torch CUDA tensors; ``d`` 64 or 128. ``causal`` is spelled as in
``flashref.paged_attention``: ``"bottom_right"`` (query ``i`` of a sequence of length ``L``
sees keys ``j <= i + L - Nq``) or ``False``; ``True`` (top-left) is refused with the same
message. ``lengths (B,)`` integers give each sequence's number of valid keys (0 allowed: zeros
and ``lse = -inf``). Arguments are checked before any GPU work, with the messages of the CPU
functions; ``lengths`` and ``block_table`` are read on the host for that (they are small).

The keys of every sequence are cut into ``num_splits`` chunks of whole 64-key tiles, one
thread block per (chunk, K/V head, sequence); ``choose_num_splits`` picks the count from the
shape and the number of SMs, ``decode_plan`` shows the whole launch and
``flashref.gpu.decode_launch`` runs it. A decode loop repeats its call's shapes and options
every token, so the checks of those are kept per call signature (``flashref.gpu.check_memo``);
``lengths`` and ``block_table`` are checked on every call.

Seven kernel versions compute the same thing (``version=``, default ``DEFAULT_VERSION``): version 1
(``decode_split_kv.cu``) shares each 64-key tile among the block's 4 warps with a block-wide
barrier per tile; version 2 (``decode_split_kv_v2.cu``) lets each warp stream its own 16-key
sub-tiles through its own copy pipeline, reads the block table once per sub-tile, and meets
the other warps only at the end; version 3 (``decode_split_kv_v3.cu``) is version 2's split
kernel with a combine kernel built for latency (every split's lse loaded at once, 16 splits'
16-byte loads of O in flight together). All use the same grid, split rule and partial layout;
versions 2 to 4 the same shared memory. Version 4 (``decode_split_kv_v4.cu``) is version 3
in one launch: the last split block of each row block to finish (a counter per row block,
``flashref.gpu.decode_counters``) merges the partials with version 3's merge, so there is no
combine kernel (``None`` in ``VERSIONS``); and each warp asks for its next sub-tile before
waiting for the current one, so its whole ring of copies is in flight while it waits.
Version 5 (``decode_split_kv_v5.cu``, sm_90a only) is version 4 with the copies made by TMA:
a producer warp loads whole 64-key tiles of K and V (boxes of 64 rows x 64 columns, 128-byte
swizzle) into a ring of ``STAGES_V5`` stages that the 4 consumer warps read; a paged cache
needs ``page_size`` a multiple of 64 there (a tile then lies in one page). Version 6
(``decode_split_kv_v6.cu``, sm_90a only) is version 5's split kernel without the last-block
merge (no counters: each split block writes its partials and ends) followed by version 3's
combine kernel, as a second launch; its plan, shared memory and page-size rule are version 5's.
Version 7 (``decode_split_kv_v7.cu``, sm_90a only) is version 6 with the producer warp asking
for its first tiles before the block's barrier (while the consumer warps load Q), not after;
all else is version 6's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .._checks import check_block, check_shapes, group_size
from .check_memo import CheckMemo
from .decode_checks import (
    HEAD_DIMS,  # noqa: F401 (flash_attention's grouped-heads check reads them from here)
    MAX_NQ,  # noqa: F401
    SM90A_VERSIONS,
    TILE_KEYS,
    TMA_ROWS,
    check_arrays,
    check_block_table,
    check_common,
    check_device,
    check_kind,
    check_lengths,
    check_page_size,
)
from .decode_launch import launch
from .versions import DTYPE_DEFINES, KERNEL_DIR, paste_includes

FILE = "decode_split_kv.cu"  # version 1
# version: (file, split kernel, combine kernel or None: the split kernel merges)
VERSIONS = {
    1: (FILE, "decode_split_kv", "decode_combine"),
    2: ("decode_split_kv_v2.cu", "decode_split_kv_v2", "decode_combine_v2"),
    3: ("decode_split_kv_v3.cu", "decode_split_kv_v2", "decode_combine_v3"),  # v2's split kernel
    4: ("decode_split_kv_v4.cu", "decode_split_kv_v4", None),  # v2's split, v3's merge, one launch
    5: ("decode_split_kv_v5.cu", "decode_split_kv_v5", None),  # TMA tiles, v4's merge
    6: ("decode_split_kv_v6.cu", "decode_split_kv_v6", "decode_combine_v3"),  # v5 split, v3 merge
    7: ("decode_split_kv_v7.cu", "decode_split_kv_v7", "decode_combine_v3"),  # v6, early tiles
}
MERGE_IN_REGISTERS = (3, 4, 5, 6, 7)  # versions whose merge holds a row's lse in registers
# version=None: on compute capability 9.0 version 7 (TMA; any contiguous cache, page sizes a
# multiple of its 64-key tile), elsewhere version 3; both from the recorded run
# (results/gpu_decode.json, on an H200): the version with the highest median ratio to SDPA
# cuDNN's bandwidth replayed from a CUDA graph (graph_ratio_to_cudnn) over the run's shapes
# (ties: the most shapes at 1.0x or more), among all versions for 9.0 and among those that
# run anywhere for the rest (a test checks both). The graph figure, because it is the
# kernels' time as a decode loop runs them; a single timed call also holds the host's time,
# which moves by more than the versions differ. The median, as the forward and backward
# defaults use it: a count of shapes past 1.0x moves with run-to-run noise wherever a
# version runs close to cuDNN.
DEFAULT_VERSION = 3
HOPPER_DEFAULT_VERSION = 7
BC = TILE_KEYS  # 64 keys per tile (16 per warp, 4 warps)
STAGES = 3  # K/V tiles in shared memory per block (version 1)
BK = 16  # keys per warp sub-tile (version 2)
STAGES_W = {128: 3, 64: 5}  # version 2: sub-tiles per warp ring, by head dim
NWARPS = 4
THREADS = 128
BLOCKS_PER_SM = 2  # what the shared memory allows at d = 128 (3 x 32 KiB tiles per block)
# versions 5 to 7: (d, row_tiles) -> ring stages of 64-key (K, V) tiles, and blocks per SM (the
# kernel file's STAGES and BLOCKS: at d = 128 with 32 rows, 2 blocks would cap registers at 168)
STAGES_V5 = {(64, 1): 6, (64, 2): 6, (128, 1): 3, (128, 2): 6}
BLOCKS_V5 = {(64, 1): 2, (64, 2): 2, (128, 1): 2, (128, 2): 1}
PRODUCER_WARPS_V5 = 1
SPLIT_BLOCKS_V5 = 1  # versions 5 to 7: blocks per SM their split rule fills (split_blocks_per_sm)
MAX_SPLITS = 128
MIN_TILES_PER_SPLIT = 2  # at least 128 keys per split: a choice, not a measurement
MAX_GRID = 65535  # gridDim.y (K/V heads x row blocks) and gridDim.z (sequences)


def check_version(version) -> int | None:
    """A decode kernel version: one of the keys of ``VERSIONS``, or None (``default_version``)."""
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise TypeError(f"version must be an int in {sorted(VERSIONS)}, got {version!r}")
    if int(version) not in VERSIONS:
        raise ValueError(f"version is {version}; the decode kernel versions are {sorted(VERSIONS)}")
    return int(version)


def check_splits(num_splits, version: int):
    """Version 3's merge (versions 3 to 6: ``MERGE_IN_REGISTERS``) holds each row's lse in
    registers: at most ``MAX_SPLITS`` splits."""
    merges = version is None or version in MERGE_IN_REGISTERS  # both defaults do
    if merges and num_splits is not None and num_splits > MAX_SPLITS:
        which = "the default decode version" if version is None else f"decode version {version}"
        raise ValueError(f"num_splits is {num_splits}; {which} merges at most {MAX_SPLITS} splits")
    return num_splits


def default_version(cc, page_size=None, rows: int = 0) -> int:
    """The version ``version=None`` runs on a GPU of compute capability ``cc`` (major, minor):
    ``HOPPER_DEFAULT_VERSION`` on 9.0 for a contiguous cache (``page_size`` None) or pages a
    multiple of its tile, with fewer than 2^31 K/V ``rows`` in the pool; else ``DEFAULT_VERSION``.
    So the default never refuses what version 3 takes."""
    hopper = tuple(cc) == (9, 0) and rows < TMA_ROWS
    if hopper and (page_size is None or page_size % TILE_KEYS == 0):
        return HOPPER_DEFAULT_VERSION
    return DEFAULT_VERSION


def blocks_per_sm(version: int, d: int, row_tiles: int) -> int:
    """Blocks of this version that fit on an SM (what its launch bounds ask ptxas for)."""
    return BLOCKS_V5[(d, row_tiles)] if version in SM90A_VERSIONS else BLOCKS_PER_SM


def split_blocks_per_sm(version: int, d: int, row_tiles: int) -> int:
    """The blocks per SM the split rule fills: ``SPLIT_BLOCKS_V5`` (one) for versions 5 to 7,
    ``blocks_per_sm`` (what fits) for the others.

    Versions 5 to 7 keep a whole ring of 64-key tiles in flight from one producer warp, so
    one block already holds an SM's share of the bandwidth; more splits only add partials to
    merge. Measured (``tools/decode_split_sweep.py``, results/gpu_decode_splits.json and
    ``_d64.json``, replayed from a CUDA graph): the split count that gives every SM one block
    was the fastest at every swept shape where the two rules differ.
    """
    return SPLIT_BLOCKS_V5 if version in SM90A_VERSIONS else blocks_per_sm(version, d, row_tiles)


def threads(version: int) -> int:
    """Threads per block: 4 warps, and the producer warp of versions 5 to 7."""
    return THREADS + 32 * PRODUCER_WARPS_V5 if version in SM90A_VERSIONS else THREADS


def source(version: int = DEFAULT_VERSION) -> str:
    """The kernel's text with its includes pasted in (as ``Version.source`` does), nested ones
    too: version 3's file includes version 2's, which includes ``mma_common.cuh``."""
    return paste_includes(KERNEL_DIR / VERSIONS[check_version(version)][0])


def defines(d: int, row_tiles: int, dtype: str) -> tuple[str, ...]:
    return (f"-DHEAD_DIM={d}", f"-DROW_TILES={row_tiles}", *DTYPE_DEFINES[dtype])


def smem_bytes(d: int, row_tiles: int, version: int = DEFAULT_VERSION) -> int:
    """Dynamic shared memory of one block, rows of d + 8 halves: the Q rows, then STAGES
    (K, V) tiles of BC keys (version 1) or NWARPS rings of STAGES_W (K, V) sub-tiles of BK
    keys (versions 2 to 4: one split kernel)."""
    if check_version(version) == 1:
        return 2 * (16 * row_tiles + STAGES * 2 * BC) * (d + 8)
    if version in SM90A_VERSIONS:  # 1 KiB to align the ring, the ring, Q, 2 STAGES mbarriers
        stages = STAGES_V5[(d, row_tiles)]
        return 1024 + stages * 2 * BC * d * 2 + 2 * 16 * row_tiles * (d + 8) + 2 * stages * 8
    return 2 * (16 * row_tiles + NWARPS * STAGES_W[d] * 2 * BK) * (d + 8)


def row_tiles(G: int, Nq: int) -> tuple[int, int]:
    """``(row_tiles, row_blocks)``: the ``G * Nq`` packed rows of a K/V head, 16 per tile.

    One block holds 16 or 32 rows (1 or 2 tiles of mma.sync's M = 16); more rows than that
    take several row blocks, each of which reads the K/V head again (from L2, mostly).
    """
    M = G * Nq
    tiles = 1 if M <= 16 else 2
    return tiles, -(-M // (16 * tiles))


def choose_num_splits(B: int, Hkv: int, Nk: int, sm_count: int, *, row_blocks: int = 1,
                      blocks_per_sm: int = BLOCKS_PER_SM) -> int:  # fmt: skip
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
def decode_plan(B, Hq, Hkv, Nq, Nk, d, sm_count, num_splits=None,
                version=DEFAULT_VERSION) -> DecodePlan:  # fmt: skip
    """The launch of ``decode_attention`` for this shape on a GPU of ``sm_count`` SMs.

    Kept per argument tuple (a plan is frozen): a decode step repeats its shape every call,
    and the split search costs more host time than a short kernel runs.
    """
    version = check_version(version)
    G = group_size(Hq, Hkv, kv="k")
    tiles, blocks = row_tiles(G, Nq)
    if num_splits is None:
        per_sm = split_blocks_per_sm(version, d, tiles)
        num_splits = choose_num_splits(B, Hkv, Nk, sm_count, row_blocks=blocks,
                                       blocks_per_sm=per_sm)  # fmt: skip
    check_splits(num_splits, version)
    grid = (num_splits, Hkv * blocks, B)
    smem = smem_bytes(d, tiles, version)
    return DecodePlan(num_splits, tiles, blocks, grid, threads(version), smem, version)


def _run(q, k, v, bt, lengths, names, *, Hkv, page_size, max_pages, Nk, num_splits, lse, version,
         **kw):  # fmt: skip
    from . import _require_gpu, _to_cupy

    cp = _require_gpu()
    from ._launch import device_facts

    cc, name, sms = device_facts()  # asked once per device
    if version is None:  # this GPU's default (a contiguous cache: bt is None)
        rows = k.shape[0] * k.shape[1] * k.shape[2]  # (pages or B) x Hkv x slots
        version = default_version(cc, None if bt is None else page_size, rows)
    check_device(cc, version, f"this GPU ({name})")
    torch_in = type(q).__module__.split(".")[0] == "torch"
    q, k, v = (_to_cupy(cp, x, n) for n, x in zip(("q", *names), (q, k, v), strict=True))
    B, Hq, Nq, d = q.shape
    plan = decode_plan(max(B, 1), Hq, Hkv, Nq, Nk, d, sms, num_splits, version)  # B = 0: none
    if plan.grid[1] > MAX_GRID or B > MAX_GRID:
        raise ValueError(f"q {tuple(q.shape)} needs a grid {plan.grid}; at most {MAX_GRID} in y, z")
    bt = None if bt is None else cp.asarray(bt)
    lengths = None if lengths is None else cp.asarray(lengths)
    O, L = launch(cp, q, k, v, bt, lengths, Hkv=Hkv, page_size=page_size, max_pages=max_pages,
                  plan=plan, **kw)  # fmt: skip
    if torch_in:
        import torch

        O, L = torch.from_dlpack(O), torch.from_dlpack(L)
    return (O, L) if lse else O


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


def decode_attention(q, k, v, *, lengths=None, causal=False, scale=None, num_splits=None,
                     return_lse=False, version=None):  # fmt: skip
    """Attention of ``Nq <= 16`` queries per sequence to a contiguous K/V cache, split-KV.

    Args:
        q: ``(B, Hq, Nq, d)``; k, v: ``(B, Hkv, Nk, d)``, ``Hq`` a multiple of ``Hkv``.
        lengths: optional integers ``(B,)``, ``0 <= lengths[b] <= Nk``: sequence ``b`` uses
            keys ``0 .. lengths[b] - 1`` (default: all ``Nk``).
        causal: ``"bottom_right"`` or ``False`` (default), as ``flashref.paged_attention``.
        scale: default ``1/sqrt(d)``; num_splits: default ``choose_num_splits``.
        return_lse: also return ``lse (B, Hq, Nq)`` in float32.
        version: the kernel version, a key of ``VERSIONS`` (all give the same results), or
            None (default) for ``default_version`` of this GPU.

    Returns ``O (B, Hq, Nq, d)`` in q's dtype, or ``(O, lse)``; torch tensors if q is one.
    """
    version, causal, scale, num_splits = _CONTIGUOUS_CHECKS(
        (q, k, v), (version, causal, scale, num_splits, return_lse))  # fmt: skip
    B, Nk = q.shape[0], k.shape[2]
    L = None if lengths is None else check_lengths(lengths, B, Nk, f"k has Nk = {Nk} keys")
    return _run(q, k, v, None, L, ("k", "v"), Hkv=k.shape[1], page_size=Nk, max_pages=1, Nk=Nk,
                causal=causal, scale=scale, num_splits=num_splits, lse=return_lse,
                version=version)  # fmt: skip


def paged_decode_attention(q, k_pages, v_pages, block_table, lengths, *, causal="bottom_right",
                           scale=None, num_splits=None, return_lse=False,
                           version=None):  # fmt: skip
    """``decode_attention`` reading K/V pages through a block table (``PagedKVCache``'s layout).

    Args:
        q: ``(B, Hq, Nq, d)``; k_pages, v_pages: ``(num_pages, Hkv, page_size, d)``.
        block_table: integers ``(B, max_pages)``; sequence ``b``'s key ``t`` is in page
            ``block_table[b, t // page_size]``, slot ``t % page_size``; entries past the pages
            in use are not read (``PagedKVCache.block_table`` fills them with -1).
        lengths: integers ``(B,)``, ``0 <= lengths[b] <= max_pages * page_size``.
        causal: ``"bottom_right"`` (default, as ``flashref.paged_attention``) or ``False``.
        scale, num_splits, return_lse, version: as ``decode_attention``.
    """
    version, causal, scale, num_splits = _PAGED_CHECKS(
        (q, k_pages, v_pages), (version, causal, scale, num_splits, return_lse))  # fmt: skip
    (B, *_), (P, Hkv, ps, _) = q.shape, k_pages.shape
    bt, L = check_block_table(block_table, lengths, B, P, ps)
    Nk_max = int(L.max()) if B else 0
    return _run(q, k_pages, v_pages, bt, L, ("k_pages", "v_pages"), Hkv=Hkv,
                page_size=ps, max_pages=bt.shape[1], Nk=Nk_max, causal=causal, scale=scale,
                num_splits=num_splits, lse=return_lse, version=version)  # fmt: skip


def cache_decode_attention(q, cache, seqs, **kwargs):
    """``paged_decode_attention`` on a ``flashref.PagedKVCache`` whose pools are on the GPU.

    Move the pools once (``cache.k_pages = cupy.asarray(cache.k_pages)``, the same for
    ``v_pages``); ``cache.block_table(seqs)`` gives the table and lengths, as on the CPU.
    Keyword arguments are those of ``paged_decode_attention``.
    """
    from ..kvcache import PagedKVCache

    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    table, lengths = cache.block_table(seqs)  # (B, max_pages), (B,): checks every id
    return paged_decode_attention(q, cache.k_pages, cache.v_pages, table, lengths, **kwargs)
