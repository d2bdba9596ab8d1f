"""Argument checks of ``flashref.gpu.decode``, all made on the host before any GPU work.

The tensors' shapes and dtypes are read from their ``shape`` and ``dtype`` (CuPy arrays,
torch tensors, and NumPy arrays in the tests). ``lengths`` and ``block_table`` given as host
arrays (NumPy, lists, CPU tensors) have every value checked, so that a length past the cache
or a page outside the pool is an error naming the entry, not an illegal memory access in the
kernel. Given as device arrays (CuPy, CUDA tensors) they stay on the device: their shapes and
dtypes are checked, their values are not read (that would be a copy to the host and a
synchronisation on every call, and a CUDA graph replays them with new values anyway); the
caller who builds them on the device answers for their values, as with FlashInfer's and
vLLM's tables (``flashref.gpu.decode`` says so where it takes them).
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    causal_bottom_right,
    check_block,
    check_flag,
    check_scale,
    masked_error,
)
from .._runtime import dtype_name
from .versions import SM90A_VERSIONS, TILE_KEYS, TMA_ROWS

MAX_NQ = 16
HEAD_DIMS = (64, 128)
DTYPES = ("float16", "bfloat16")


def check_arrays(q, k, v, kname: str, vname: str) -> None:
    """q and a K/V pair are arrays of 4 dimensions (the layouts of the docstrings)."""
    want = "(num_pages, Hkv, page_size, d)" if kname == "k_pages" else "(B, Hkv, Nk, d)"
    for name, x in (("q", q), (kname, k), (vname, v)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "ndim")):
            raise TypeError(
                f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}"
            )
        if x.ndim != 4:
            shape = "(B, Hq, Nq, d)" if name == "q" else want
            raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {shape}")


def check_kind(q, k, v, kname: str, vname: str):
    """1 <= Nq <= 16, v's head dim that of q, one 16-bit dtype, d in HEAD_DIMS."""
    Nq, d = q.shape[2], q.shape[3]
    if not 1 <= Nq <= MAX_NQ:
        raise ValueError(
            f"q has {Nq} queries per sequence (shape {tuple(q.shape)}); the decode kernel takes "
            f"1 <= Nq <= {MAX_NQ}: for longer query blocks (a prefill) use "
            "flashref.gpu.flash_attention"
        )
    if v.shape[-1] != d:
        raise ValueError(f"{vname} has shape {tuple(v.shape)}; its head dim must equal q's, {d}")
    dtypes = {dtype_name(x) for x in (q, k, v)}
    if len(dtypes) != 1:
        raise TypeError(
            f"q, {kname}, {vname} must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype} "
            "(no implicit casts)"
        )
    dtype = dtypes.pop()
    if dtype not in DTYPES:
        raise TypeError(f"q has dtype {dtype}; the decode kernel supports {', '.join(DTYPES)}")
    if d not in HEAD_DIMS:
        raise ValueError(f"q has head dim d={d}; the decode kernel supports d in {HEAD_DIMS}")
    return dtype, d


def host_ints(x, name: str, ndim: int) -> np.ndarray:
    """An integer array (NumPy, list, CuPy or torch) copied to the host, of rank ``ndim``
    (a masked array is refused: its mask would be dropped)."""
    if isinstance(x, np.ma.MaskedArray):  # its mask would be dropped
        raise masked_error(name)
    if hasattr(x, "detach"):  # torch
        x = x.detach().cpu().numpy()
    elif type(x).__module__.split(".")[0] == "cupy":
        x = x.get()
    try:
        arr = np.asarray(x)
    except ValueError as exc:  # a ragged list: rows of different lengths
        raise ValueError(
            f"{name} must be a rectangular array of integers, {ndim}-D; got "
            f"{type(x).__name__} that NumPy cannot make one array of ({exc})"
        ) from None
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} has dtype {arr.dtype}; expected integers (int32)")
    if arr.ndim != ndim:
        raise ValueError(f"{name} has shape {arr.shape}; expected {ndim} dimension(s)")
    return arr


def is_device_array(x) -> bool:
    """A CuPy array or a torch CUDA tensor (read by the kernel where it is)."""
    top = type(x).__module__.split(".")[0]
    if top == "cupy":
        return hasattr(x, "data") and hasattr(x.data, "ptr")
    return top == "torch" and getattr(x, "is_cuda", False)


def check_device_ints(x, name: str, shape: tuple, want: str) -> None:
    """A device array of integers of ``shape`` (None: any length there); its values are
    not read."""
    kind = str(x.dtype).removeprefix("torch.")
    if not (kind.startswith("int") or kind.startswith("uint")):
        raise TypeError(f"{name} has dtype {kind}; expected integers (int32)")
    got = tuple(x.shape)
    if len(got) != len(shape) or any(
        w is not None and g != w for g, w in zip(got, shape, strict=True)
    ):
        raise ValueError(f"{name} has shape {got}; expected {want}")


def tables_on_device(paged: bool, bt, lengths, B: int) -> bool:
    """Where a call's tables are, decided once for its signature: True for device arrays
    (read by the kernels where they are: their shapes and dtypes checked here, their values
    never read on the host) or no table at all, False for host arrays (every value checked
    on every call, ``flashref.gpu.decode.api.DecodeCall.run``). A paged call gives both
    tables in one place."""
    if not paged:
        if lengths is None:
            return True
        if not is_device_array(lengths):
            return False
        check_device_ints(lengths, "lengths", (B,), f"({B},), one per sequence of q")
        return True
    on_device = is_device_array(bt), is_device_array(lengths)
    if not any(on_device):
        return False
    for ok, name in zip(on_device, ("block_table", "lengths"), strict=True):
        if not ok:
            raise TypeError(
                f"{name} is a host array but the other table is on the device; give "
                "block_table and lengths both on the device (read there) or both on "
                "the host (every value checked)"
            )
    check_device_ints(bt, "block_table", (B, None), f"({B}, max_pages)")
    check_device_ints(lengths, "lengths", (B,), f"({B},), one per sequence of q")
    return True


def check_lengths(lengths, B: int, limit: int, what: str) -> np.ndarray:
    L = host_ints(lengths, "lengths", 1)
    if L.shape != (B,):
        raise ValueError(f"lengths has shape {L.shape}; expected ({B},), one per sequence of q")
    bad = np.flatnonzero((L < 0) | (L > limit))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"lengths[{b}] is {int(L[b])}; expected 0 <= length <= {limit} ({what})")
    return L.astype(np.int32, copy=False)


def check_common(causal, scale, num_splits, return_lse, d):
    causal = causal_bottom_right(causal, "the decode kernels")
    check_flag(return_lse, "return_lse")
    if num_splits is not None:
        num_splits = check_block(num_splits, "num_splits")
    return causal, check_scale(scale, d, "float32"), num_splits


def check_block_table(block_table, lengths, B: int, P: int, ps: int):
    """``block_table (B, max_pages)`` and ``lengths (B,)`` as int32 host arrays; every page a
    sequence uses (the first ``ceil(L / ps)`` entries) must be in ``[0, P)``."""
    bt = host_ints(block_table, "block_table", 2)
    if bt.shape[0] != B:
        raise ValueError(f"block_table has shape {bt.shape}; expected ({B}, max_pages)")
    L = check_lengths(lengths, B, bt.shape[1] * ps, f"block_table holds {bt.shape[1]} pages")
    pages = -(-L.astype(np.int64) // ps)  # (B,) pages each sequence uses
    used = np.arange(bt.shape[1]) < pages[:, None]  # (B, max_pages)
    bad = used & ((bt < 0) | (bt >= P))  # (B, max_pages)
    if bad.any():
        b, j = (int(i) for i in np.argwhere(bad)[0])  # row-major: the first b, then its first j
        raise ValueError(
            f"block_table[{b}, {j}] is {int(bt[b, j])}, a page sequence {b} uses (length "
            f"{int(L[b])}); expected 0 <= page < {P} (num_pages of k_pages)"
        )
    return bt.astype(np.int32, copy=False), L  # no copy when the caller holds int32


def check_device(cc: tuple[int, int], version: int, name: str = "this GPU") -> None:
    """Versions 5 to 7 need an sm_90a GPU (compute capability 9.0 exactly): a clear error,
    not an NVRTC failure."""
    if version in SM90A_VERSIONS and tuple(cc) != (9, 0):
        raise RuntimeError(
            f"decode version {version} is built for sm_90a (TMA) and needs compute capability "
            f"9.0 exactly; {name} has compute capability {cc[0]}.{cc[1]}"
        )


def check_page_size(page_size: int, rows: int, version: int, what: str) -> None:
    """Versions 5 to 7 load 64-key tiles from one page: page_size a multiple of TILE_KEYS;
    and their row index (``rows`` K/V rows in the pool) must fit an int32."""
    if version not in SM90A_VERSIONS:
        return
    if page_size % TILE_KEYS:
        raise ValueError(
            f"page_size is {page_size}; decode version {version} reads whole {TILE_KEYS}-key "
            f"tiles from one page, so page_size must be a multiple of {TILE_KEYS} (versions 1 "
            "to 4 take any)"
        )
    if rows >= TMA_ROWS:
        raise ValueError(
            f"{what} holds {rows} K/V rows; decode version {version} addresses at most "
            f"{TMA_ROWS - 1}"
        )
