"""The decode kernel versions: their files, kernels, launch constants and defaults.

Seven kernel versions compute the same thing (``version=``, default ``DEFAULT_VERSION``): version 1
(``v01_split_kv.cu``) shares each 64-key tile among the block's 4 warps with a block-wide
barrier per tile; version 2 (``v02_warp_rings.cu``) lets each warp stream its own 16-key
sub-tiles through its own copy pipeline, reads the block table once per sub-tile, and meets
the other warps only at the end; version 3 (``v03_register_merge.cu``) is version 2's split
kernel with a combine kernel built for latency (every split's lse loaded at once, 16 splits'
16-byte loads of O in flight together). All use the same grid, split rule and partial layout;
versions 2 to 4 the same shared memory. Version 4 (``v04_last_block_merge.cu``) is version 3
in one launch: the last split block of each row block to finish (a counter per row block,
``flashref.gpu.decode.buffers``) merges the partials with version 3's merge, so there is no
combine kernel (``None`` in ``VERSIONS``); and each warp asks for its next sub-tile before
waiting for the current one, so its whole ring of copies is in flight while it waits.
Version 5 (``v05_tma_producer.cu``, sm_90a only) is version 4 with the copies made by TMA:
a producer warp loads whole 64-key tiles of K and V (boxes of 64 rows x 64 columns, 128-byte
swizzle) into a ring of ``STAGES_V5`` stages that the 4 consumer warps read; a paged cache
needs ``page_size`` a multiple of 64 there (a tile then lies in one page). Version 6
(``v06_tma_two_launches.cu``, sm_90a only) is version 5's split kernel without the last-block
merge (no counters: each split block writes its partials and ends) followed by version 3's
combine kernel, as a second launch; its plan, shared memory and page-size rule are version 5's.
Version 7 (``v07_early_tiles.cu``, sm_90a only) is version 6 with the producer warp asking
for its first tiles before the block's barrier (while the consumer warps load Q), not after;
all else is version 6's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..registry import DTYPE_DEFINES, KernelVersion

SM90A_VERSIONS = (5, 6, 7)  # decode versions built for sm_90a: compute capability 9.0 exactly
TILE_KEYS = 64  # keys per tile: version 5's TMA box rows
TMA_ROWS = 2**31  # version 5 addresses K/V rows (pages x Hkv x page_size) with int32


@dataclass(frozen=True)
class DecodeVersion(KernelVersion):
    """One decode version: its file under ``flashref/kernels/decode/``, the split kernel, and
    the combine kernel that merges the splits' partials (None: the split kernel merges)."""

    number: int
    name: str
    file: str
    split_kernel: str
    combine_kernel: str | None
    min_cc: tuple[int, int] = (8, 0)  # mma.sync m16n8k16 bf16, cp.async, ldmatrix
    arch: str | None = None  # versions 5 to 7: "sm_90a" (TMA), compute capability 9.0 only

    kind = "decode "
    folder = "decode"

    def defines(self, d: int, dtype: str, row_tiles: int = 1) -> tuple[str, ...]:
        return defines(d, row_tiles, dtype)


_SM90A = {"min_cc": (9, 0), "arch": "sm_90a"}
VERSIONS = {
    v.number: v
    for v in (
        DecodeVersion(1, "block_tiles", "v01_split_kv.cu", "decode_split_kv", "decode_combine"),
        DecodeVersion(
            2, "warp_rings", "v02_warp_rings.cu", "decode_split_kv_v2", "decode_combine_v2"
        ),
        DecodeVersion(
            3, "register_merge", "v03_register_merge.cu", "decode_split_kv_v2", "decode_combine_v3"
        ),  # version 2's split kernel
        DecodeVersion(
            4, "last_block_merge", "v04_last_block_merge.cu", "decode_split_kv_v4", None
        ),  # version 2's split, version 3's merge, one launch
        DecodeVersion(
            5, "tma_producer", "v05_tma_producer.cu", "decode_split_kv_v5", None, **_SM90A
        ),  # TMA tiles, version 4's merge
        DecodeVersion(
            6,
            "tma_two_launches",
            "v06_tma_two_launches.cu",
            "decode_split_kv_v6",
            "decode_combine_v3",
            **_SM90A,
        ),  # version 5's split, version 3's merge
        DecodeVersion(
            7,
            "early_tiles",
            "v07_early_tiles.cu",
            "decode_split_kv_v7",
            "decode_combine_v3",
            **_SM90A,
        ),  # version 6, its first tiles earlier
    )
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
    """A decode kernel version: one of the keys of ``VERSIONS``, or None
    (``default_decode_version``)."""
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


def default_decode_version(cc, page_size=None, rows: int = 0) -> int:
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
    merge. Measured (``flashref/bench/decode_split_sweep.py``, results/gpu_decode_splits.json and
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
    return VERSIONS[check_version(version)].source()


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
