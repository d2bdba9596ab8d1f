"""Split-KV decoding on the GPU: a few queries per sequence against a long (paged) K/V cache.

This module only gathers what a user calls and what the chapters read; each piece lives in
its own module:

* ``api``: ``decode_attention``, ``paged_decode_attention``, ``cache_decode_attention``,
  ``choose_num_splits`` and ``decode_plan`` (the split count and launch of a shape);
* ``versions``: the kernel versions (``VERSIONS``, files under ``flashref/kernels/decode/``),
  the facts about them (``SM90A_VERSIONS``, ``TILE_KEYS``, ``TMA_ROWS``), their launch
  constants and the default (``default_decode_version``);
* ``checks``: the argument checks, with the messages of the CPU functions (a call's are
  made once per call signature: ``api.DecodeCall``, the plan of an eager call);
* ``plan``: ``PagedDecodePlan``, a paged call checked and planned once, then run (and
  replayed from a CUDA graph) with no host work but the launch;
* ``cache``: ``DevicePagedKVCache``, the paged cache on the GPU, its appends on the device;
* ``prefill``: ``paged_prefill_attention``, a chunk of a prompt's queries against its paged
  cache (the chunked prefill);
* ``launch``: the launch itself; ``buffers`` the reused buffers of the split partials and of
  version 4's merge (one per device, stream and size class).
"""

from __future__ import annotations

from .api import (
    DecodePlan,
    cache_decode_attention,
    choose_num_splits,
    decode_attention,
    decode_plan,
    paged_decode_attention,
    row_tiles,
)
from .cache import DevicePagedKVCache
from .checks import HEAD_DIMS, MAX_NQ
from .plan import PagedDecodePlan
from .prefill import paged_prefill_attention
from .versions import (
    BC,
    BK,
    BLOCKS_PER_SM,
    BLOCKS_V5,
    DEFAULT_VERSION,
    HOPPER_DEFAULT_VERSION,
    MAX_GRID,
    MAX_SPLITS,
    MERGE_IN_REGISTERS,
    MIN_TILES_PER_SPLIT,
    NWARPS,
    PRODUCER_WARPS_V5,
    SM90A_VERSIONS,
    SPLIT_BLOCKS_V5,
    STAGES,
    STAGES_V5,
    STAGES_W,
    THREADS,
    TILE_KEYS,
    TMA_ROWS,
    VERSIONS,
    DecodeVersion,
    blocks_per_sm,
    check_splits,
    check_version,
    default_decode_version,
    defines,
    smem_bytes,
    source,
    split_blocks_per_sm,
    threads,
)

__all__ = [
    "BC",
    "BK",
    "BLOCKS_PER_SM",
    "BLOCKS_V5",
    "DEFAULT_VERSION",
    "HEAD_DIMS",
    "HOPPER_DEFAULT_VERSION",
    "MAX_GRID",
    "MAX_NQ",
    "MAX_SPLITS",
    "MERGE_IN_REGISTERS",
    "MIN_TILES_PER_SPLIT",
    "NWARPS",
    "PRODUCER_WARPS_V5",
    "SM90A_VERSIONS",
    "SPLIT_BLOCKS_V5",
    "STAGES",
    "STAGES_V5",
    "STAGES_W",
    "THREADS",
    "TILE_KEYS",
    "TMA_ROWS",
    "VERSIONS",
    "DecodePlan",
    "DecodeVersion",
    "DevicePagedKVCache",
    "PagedDecodePlan",
    "blocks_per_sm",
    "cache_decode_attention",
    "check_splits",
    "check_version",
    "choose_num_splits",
    "decode_attention",
    "decode_plan",
    "default_decode_version",
    "defines",
    "paged_decode_attention",
    "paged_prefill_attention",
    "row_tiles",
    "smem_bytes",
    "source",
    "split_blocks_per_sm",
    "threads",
]
