"""The TMA descriptor of a CuPy array: what Hopper's bulk tensor copies read.

``tensor_map(x, box_rows)`` makes the descriptor (the driver's ``cuTensorMapEncodeTiled``,
called by ``flashref.gpu._driver``) of a row-major 2-D fp16 or bf16 CuPy array, with a
(box_rows, 64) box and the 128-byte swizzle, as the 128-byte value a kernel takes as
``const __grid_constant__``.
Its arguments are checked here, naming the one that is wrong, before the driver is asked.
What the driver accepts (``check_tensor_map_args``) and where the swizzle puts each element
are modelled in ``flashref.hardware.hopper``.

NumPy only at import: the driver is reached inside ``tensor_map``.
"""

from __future__ import annotations

import numpy as np

from ..hardware.hopper import ELEMENT_BYTES, check_tensor_map_args
from ._driver import encode_tensor_map

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


def _encode(
    ptr: int, rows: int, cols: int, row_bytes: int, dtype: str, box_rows: int, box_cols: int
) -> bytes:
    """The driver's ``cuTensorMapEncodeTiled`` (``flashref.gpu._driver``: through ctypes, a
    microsecond or two a descriptor, where ``cuda.bindings``' wrapper objects cost tens)."""

    return encode_tensor_map(ptr, rows, cols, row_bytes, dtype, box_rows, box_cols)
