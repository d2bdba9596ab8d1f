"""FlashAttention on NVIDIA GPUs: the kernels the book writes, as functions of CuPy arrays.

This module only gathers what a user calls; each piece lives in its own module:

* ``forward``: ``flash_attention`` (``forward_versions``: the numbered forward versions, the
  default per dtype, d and causal, ``kernel_diff``);
* ``backward``: ``flash_attention_backward`` (``backward_versions``);
* ``decode``: split-KV decoding over contiguous and paged K/V caches (a subpackage);
* ``prefill``: ``paged_prefill_attention``, a prompt chunk's queries against a paged cache;
* ``_runtime``, ``_launch``, ``tma``, ``registry``, ``tolerances``: what those share;
* ``models``: NumPy models of the fragment layouts and schedules the chapters draw (the
  runtime never imports them).

    from flashref.gpu import flash_attention
    O = flash_attention(q, k, v, causal=True)  # q, k, v: cupy arrays (..., N, d)

CuPy is imported only when a kernel is called, so ``import flashref.gpu`` works on any
machine; calling without CuPy or without a GPU raises ``GPUUnavailableError`` saying what is
missing and how to install it.
"""

from __future__ import annotations

from ._runtime import DTYPES, GPUUnavailableError, available, gpu_unavailable_reason
from .backward import flash_attention_backward
from .backward_versions import BWD_VERSIONS, BwdVersion
from .decode import (
    DevicePagedKVCache,
    PagedDecodePlan,
    cache_decode_attention,
    choose_num_splits,
    decode_attention,
    decode_plan,
    paged_decode_attention,
    paged_prefill_attention,
)
from .forward import flash_attention
from .forward_versions import HOPPER_PREFERENCE, PREFERENCE, VERSIONS, Version
from .registry import KERNEL_DIR

__all__ = [
    "BWD_VERSIONS",
    "BwdVersion",
    "DTYPES",
    "GPUUnavailableError",
    "KERNEL_DIR",
    "HOPPER_PREFERENCE",
    "PREFERENCE",
    "VERSIONS",
    "Version",
    "available",
    "DevicePagedKVCache",
    "PagedDecodePlan",
    "cache_decode_attention",
    "choose_num_splits",
    "decode_attention",
    "decode_plan",
    "flash_attention",
    "flash_attention_backward",
    "gpu_unavailable_reason",
    "paged_decode_attention",
    "paged_prefill_attention",
]
