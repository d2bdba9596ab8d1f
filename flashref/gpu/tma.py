"""The TMA descriptor of a CuPy array: what Hopper's bulk tensor copies read.

``tensor_map(x, box_rows)`` makes the descriptor (the driver's ``cuTensorMapEncodeTiled``,
called by ``flashref.gpu._driver``) of a row-major 2-D fp16 or bf16 CuPy array, with a
(box_rows, 64) box and the 128-byte swizzle, as the 128-byte value a kernel takes as
``const __grid_constant__``.
Its arguments are checked here, naming the one that is wrong, before the driver is asked.
Where the swizzle puts each element is modelled in ``flashref.gpu.models.hopper``.

NumPy only at import: the driver is reached inside ``tensor_map``.
"""

from __future__ import annotations

import numbers

import numpy as np

ROW_BYTES = 128  # one swizzled row: 64 16-bit elements
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2}
MAX_BOX = 256  # a TMA box has at most 256 elements along each dimension


def _int(value, name: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        span = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be {span}, got {value}")
    return int(value)


def check_tensor_map_args(shape, dtype: str, strides, ptr: int, box_rows, box_cols=64) -> int:
    """The element size; or the error cuTensorMapEncodeTiled would give, in words.

    ``shape`` (rows, cols) and ``strides`` (bytes) of a 2-D array at address ``ptr``;
    the box is (box_rows, box_cols) elements, loaded with the 128-byte swizzle.
    """
    if dtype not in ELEMENT_BYTES:
        raise TypeError(f"x must be float16 or bfloat16 (TMA of 16-bit tiles), got {dtype}")
    size = ELEMENT_BYTES[dtype]
    if len(shape) != 2:
        raise ValueError(f"x must be 2-D (rows, cols), got shape {tuple(shape)}")
    rows, cols = shape
    if not (1 <= rows <= 2**32 and 1 <= cols <= 2**32):
        raise ValueError(f"x must have 1..2^32 rows and columns, got shape {tuple(shape)}")
    if strides[1] != size:
        raise ValueError(f"x must be row-major with contiguous rows, got strides {tuple(strides)}")
    if strides[0] % 16 or not 0 < strides[0] < 2**40:
        raise ValueError(
            f"x's row stride must be a positive multiple of 16 bytes (below 2^40), "
            f"got {strides[0]} bytes"
        )
    if ptr % 16:
        raise ValueError(f"x's data must start at a 16-byte aligned address, got {ptr:#x}")
    box_rows = _int(box_rows, "box_rows", 1, MAX_BOX)
    box_cols = _int(box_cols, "box_cols", 1, MAX_BOX)
    if box_cols * size % 16 or box_cols * size > ROW_BYTES:
        raise ValueError(
            f"box_cols * {size} bytes must be a multiple of 16 and at most 128 for the "
            f"128-byte swizzle, got box_cols={box_cols} ({box_cols * size} bytes)"
        )
    return size


MAP_DTYPE = np.dtype((np.void, 128))  # how a descriptor is passed to a CuPy launch


def tensor_map(x, box_rows, box_cols=64) -> np.void:
    """The 128-byte TMA descriptor of ``x`` (a 2-D float16/bfloat16 CuPy array, row-major).

    Box (box_rows, box_cols), 128-byte swizzle, out-of-bounds elements read as zero. The
    descriptor holds x's address: make it again for another array. Pass the result as a
    kernel argument of type ``const __grid_constant__ TensorMap``.
    """
    if not all(hasattr(x, a) for a in ("shape", "dtype", "strides")) or not hasattr(
        getattr(x, "data", None), "ptr"
    ):
        raise TypeError(f"x must be a CuPy array (GPU memory), got {type(x).__name__}")
    dtype = str(x.dtype)
    rows_cols, strides = tuple(x.shape), tuple(x.strides)
    check_tensor_map_args(rows_cols, dtype, strides, x.data.ptr, box_rows, box_cols)
    raw = _encode(x.data.ptr, *rows_cols, strides[0], dtype, box_rows, box_cols)
    return np.frombuffer(raw, dtype=MAP_DTYPE)[0]


def tensor_map_at(ptr: int, rows: int, cols: int, dtype: str, box_rows, box_cols=64) -> bytes:
    """The 128 bytes of ``tensor_map`` of the C-contiguous (rows, cols) ``dtype`` array at
    address ``ptr`` (a torch tensor's memory, for example), with the same checks: what
    ``flashref.gpu._driver.Launcher`` passes (``np.frombuffer(m, MAP_DTYPE)[0]`` for CuPy)."""
    size = ELEMENT_BYTES.get(dtype, 2)
    check_tensor_map_args((rows, cols), dtype, (cols * size, size), ptr, box_rows, box_cols)
    return _encode(ptr, rows, cols, cols * size, dtype, box_rows, box_cols)


def _encode(ptr: int, rows: int, cols: int, row_bytes: int, dtype: str, box_rows: int,
            box_cols: int) -> bytes:  # fmt: skip
    """The driver's ``cuTensorMapEncodeTiled`` (``flashref.gpu._driver``: through ctypes, a
    microsecond or two a descriptor, where ``cuda.bindings``' wrapper objects cost tens)."""
    from ._driver import encode_tensor_map

    return encode_tensor_map(ptr, rows, cols, row_bytes, dtype, box_rows, box_cols)
