"""flashref: FlashAttention from first principles, in small readable pieces.

The CPU reference implementations every chapter of the book builds on:

- softmax:    ``naive_softmax``, ``safe_softmax``, ``online_softmax``
- state:      ``SoftmaxState`` (running m, l, O), ``merge_states``,
              ``streaming_weighted_sum`` (the one-query worked example)
- attention:  ``naive_attention``, ``tiled_attention`` (FlashAttention-2 loop
              order), ``tiled_attention_kv_outer`` (Algorithm 1 loop order)
- backward:   ``naive_attention_backward``, ``tiled_attention_backward``
              (FlashAttention-2's backward: key/value tiles outside, P recomputed
              from lse)
- ring:       ``ring_attention`` (one sequence sharded over simulated devices,
              K/V blocks passed round a ring), ``RingSchedule``, ``shard_positions``
- decode:     ``split_kv_attention`` (Flash-Decoding: the keys cut into chunks whose
              partial results are merged by their lse), ``split_bounds``, ``KVSplit``
- kvcache:    ``PagedKVCache`` (a pool of K/V pages, a block table per sequence),
              ``paged_attention`` (a batch of sequences of different lengths read
              through their block tables; bottom-right causal), ``CacheFullError``
- variants:   ``flashref.variants`` (sliding windows, softcap, ALiBi, sinks, user
              ``score_mod`` / ``mask_mod``, the block mask), keywords of the naive and
              tiled attention functions, forward and backward
- varlen:     ``varlen_attention``, ``varlen_attention_backward`` (a packed batch:
              sequences of different lengths end to end, ``cu_seqlens`` offsets, as
              flash-attn's varlen functions take them)

Every attention function takes grouped-query attention: q (..., Hq, N, d) with k, v
(..., Hkv, N, d) and Hq a multiple of Hkv.

GPU kernels live in ``flashref.gpu`` (needs CuPy and an NVIDIA GPU; imported
only when asked for), exercise checkers in ``flashref.exercises``, benchmarks
in ``python -m flashref.bench``, and the IO model of Theorem 2 (bytes moved
between HBM and on-chip memory, by loop order) in ``flashref.io_model``.
``results_dir()`` is the folder of recorded measurements the chapters read.
"""

import os
from pathlib import Path

from . import _blas_flags
from .attention import naive_attention, tiled_attention, tiled_attention_kv_outer
from .backward import naive_attention_backward, tiled_attention_backward
from .decode import KVSplit, split_bounds, split_kv_attention
from .kvcache import CacheFullError, PagedKVCache, paged_attention
from .ring import RingSchedule, ring_attention, shard_positions
from .softmax import naive_softmax, online_softmax, safe_softmax
from .state import SoftmaxState, merge_states, streaming_weighted_sum
from .varlen import varlen_attention, varlen_attention_backward

__all__ = [
    "CacheFullError",
    "KVSplit",
    "PagedKVCache",
    "RingSchedule",
    "SoftmaxState",
    "merge_states",
    "naive_attention",
    "naive_attention_backward",
    "naive_softmax",
    "results_dir",
    "online_softmax",
    "paged_attention",
    "ring_attention",
    "safe_softmax",
    "shard_positions",
    "split_bounds",
    "split_kv_attention",
    "streaming_weighted_sum",
    "tiled_attention",
    "tiled_attention_backward",
    "tiled_attention_kv_outer",
    "varlen_attention",
    "varlen_attention_backward",
]

__version__ = "0.1.0"

RESULTS_ENV = "FLASHREF_RESULTS"  # a folder of recorded measurements, in place of results/


def results_dir() -> Path:
    """The folder of recorded measurements the chapters read (the repository's ``results/``).

    ``$FLASHREF_RESULTS`` where it is set (a chapter opened outside a checkout reads a copy
    of the files from there); otherwise the ``results/`` of the checkout this package runs
    from.

    Returns:
        The folder, a ``pathlib.Path``.

    Raises:
        FileNotFoundError: neither is a folder (a wheel install carries no recorded files);
            the message says where it looked and what to do.
    """
    where = os.environ.get(RESULTS_ENV)
    if where:
        path = Path(where).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(
                f"{RESULTS_ENV} is {where!r}, which is not a folder; point it at a copy of the "
                "repository's results/ folder"
            )
        return path
    path = Path(__file__).resolve().parent.parent / "results"
    if not path.is_dir():
        raise FileNotFoundError(
            f"no results/ folder beside this flashref (looked for {path}): the chapters read "
            "the measurements recorded in the repository; run them from a clone of it "
            f"(pip install -e .), or set {RESULTS_ENV} to a folder holding its results/ files"
        )
    return path


_blas_flags.ignore_stray_matmul_flag()  # a CPU-dependent OpenBLAS flag, not a NaN: see _blas_flags
