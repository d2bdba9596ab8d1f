"""The two driver calls on the hot path of every launch, with their arguments packed by hand.

A call that has been checked and planned once (``flashref.gpu._host``) still launches a
kernel and, for the Hopper versions, encodes a TMA descriptor for each input's address.
Through CuPy (``RawKernel.__call__``) and ``cuda.bindings`` (``cuTensorMapEncodeTiled``) each
costs microseconds of Python wrapping per call: every argument converted to a wrapper
object and back. Here the same two driver functions are called with their arguments packed
the way the driver reads them:

* ``Launcher``: one kernel's ``cuLaunchKernel``, its argument kinds fixed when it is made
  (``"p"`` a device address, ``"i"`` int32, ``"f"`` float32, ``"q"`` int64, ``"m"`` a 128-byte
  TMA descriptor), each call packing the values into one buffer with ``struct`` and passing
  the driver the array of pointers into it (made once). The driver function is called
  through CuPy's own binding of it (``cupy.cuda.driver.launchKernel``, compiled Cython,
  which takes the eleven arguments as plain integers and releases the GIL around the call)
  where CuPy has one, else through ``ctypes``, whose conversion of eleven arguments costs
  microseconds.
* ``encode_tensor_map``: ``cuTensorMapEncodeTiled`` of a row-major 2-D 16-bit array with a
  (box_rows, 64) box and the 128-byte swizzle, the descriptor ``flashref.gpu.tma`` makes
  with ``cuda.bindings`` (a GPU test checks the bytes are the same), the enumerations'
  values read from ``cuda.bindings`` once; with ``heads``, the 3-D float32 map through which
  backward version 16 adds its staged dQ tiles (``flashref.gpu._launch.dq_tensor_map``).

The kernels themselves are still compiled and loaded by CuPy (``RawModule``); a launcher
takes the loaded function's handle (``RawKernel.kernel.ptr``). Nothing here is imported
before a GPU call: ``libcuda`` is opened on first use.
"""

from __future__ import annotations

import ctypes
import struct
import threading

# argument kind -> (struct code, alignment in the buffer)
KINDS = {"p": ("Q", 8), "i": ("i", 4), "f": ("f", 4), "q": ("q", 8), "m": ("128s", 64)}
CUDA_ERROR_INVALID_CONTEXT = 201

_lib: list = []


def libcuda():
    """The driver library, opened once, with the prototypes of the functions used here."""
    if not _lib:
        lib = ctypes.CDLL("libcuda.so.1")  # ctypes releases the GIL around each call
        u32, vp = ctypes.c_uint, ctypes.c_void_p
        lib.cuLaunchKernel.argtypes = [
            vp,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            vp,
            ctypes.POINTER(vp),
            ctypes.POINTER(vp),
        ]
        lib.cuLaunchKernel.restype = ctypes.c_int
        lib.cuTensorMapEncodeTiled.argtypes = [
            vp,
            ctypes.c_int,
            u32,
            vp,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(u32),
            ctypes.POINTER(u32),
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _lib.append(lib)
    return _lib[0]


def error_string(code: int) -> str:
    text = ctypes.c_char_p()
    if libcuda().cuGetErrorString(code, ctypes.byref(text)) != 0 or not text.value:
        return f"CUDA driver error {code}"
    return f"{text.value.decode()} (CUDA driver error {code})"


def make_context_current() -> bool:
    """Make the current device's primary context current on this thread, for a thread that
    has not called CUDA yet (the autograd engine's, say): the runtime binds it on its first
    call that needs one. True, so a caller can retry what failed with
    ``CUDA_ERROR_INVALID_CONTEXT``."""
    import cupy

    cupy.cuda.runtime.free(0)
    return True


def layout(kinds: str) -> tuple[str, tuple[int, ...], int]:
    """``(struct format, offsets, size)`` of arguments of these kinds packed in order, each
    at its alignment (what the pointer array points at). No GPU needed."""
    fmt, offsets, at = "<", [], 0
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"argument kind {kind!r} is not one of {''.join(KINDS)}")
        code, align = KINDS[kind]
        pad = -at % align
        fmt += "x" * pad + code
        at += pad
        offsets.append(at)
        at += struct.calcsize("<" + code)
    return fmt, tuple(offsets), at


def kinds_of(args) -> str:
    """The argument kinds of a launch's values as the direct routes pass them: a Python int
    is a device address, NumPy int32 / float32 / int64 scalars are those, 128 bytes a TMA
    descriptor. Anything else is an error naming its position."""
    import numpy as np

    kinds = []
    for i, a in enumerate(args):
        if isinstance(a, np.int32):
            kinds.append("i")
        elif isinstance(a, np.float32):
            kinds.append("f")
        elif isinstance(a, np.int64):
            kinds.append("q")
        elif isinstance(a, bytes) and len(a) == 128:
            kinds.append("m")
        elif isinstance(a, int) and not isinstance(a, bool):
            kinds.append("p")
        else:
            raise TypeError(f"launch argument {i} is a {type(a).__name__}, not a kind {KINDS}")
    return "".join(kinds)


class Launcher:
    """``cuLaunchKernel`` of one loaded kernel (``kernel``: a CuPy ``RawKernel`` whose module
    is loaded on the current device), its arguments of the given ``kinds``.

    ``launcher(grid, block, shared_mem, stream, args)``: ``grid`` and ``block`` 3-tuples,
    ``stream`` the stream's handle (an int), ``args`` the values in order (Python or NumPy
    ints and floats, ``bytes`` of a descriptor). One buffer per launcher, filled and launched
    under a lock (the driver copies the values during the call), so threads may share it.
    """

    def __init__(self, kernel, kinds: str):
        self.func = ctypes.c_void_p(kernel.kernel.ptr)  # the CUfunction on this device
        self.kinds = kinds
        fmt, offsets, size = layout(kinds)
        self.pack = struct.Struct(fmt).pack_into
        self.buf = (ctypes.c_char * max(size, 1))()
        base = ctypes.addressof(self.buf)
        self.params = (ctypes.c_void_p * max(len(kinds), 1))(*(base + o for o in offsets))
        self.lock = threading.Lock()
        self.launch = libcuda().cuLaunchKernel
        self.fast = _cupy_launch()
        self.func_int, self.params_int = kernel.kernel.ptr, ctypes.addressof(self.params)

    def __call__(self, grid, block, shared_mem: int, stream: int, args) -> None:
        gx, gy, gz = grid
        bx, by, bz = block
        with self.lock:
            self.pack(self.buf, 0, *args)
            if self.fast is not None:
                try:
                    self.fast(
                        self.func_int,
                        gx,
                        gy,
                        gz,
                        bx,
                        by,
                        bz,
                        shared_mem,
                        stream,
                        self.params_int,
                        0,
                    )
                    return
                except Exception as exc:  # CuPy's CUDADriverError: the same code, retried
                    rc = getattr(exc, "status", None)
                    if rc is None:
                        raise
            else:
                rc = self.launch(
                    self.func, gx, gy, gz, bx, by, bz, shared_mem, stream, self.params, None
                )
            if rc == CUDA_ERROR_INVALID_CONTEXT and make_context_current():
                rc = self.launch(
                    self.func, gx, gy, gz, bx, by, bz, shared_mem, stream, self.params, None
                )
        if rc:
            raise RuntimeError(f"cuLaunchKernel failed: {error_string(rc)}")


def _cupy_launch():
    """CuPy's compiled binding of ``cuLaunchKernel``, or None where this CuPy has none."""
    try:
        from cupy.cuda import driver
    except ImportError:
        return None
    return getattr(driver, "launchKernel", None)


_enums: dict = {}


def _enum_values() -> dict:
    """The enumeration values the descriptor is encoded with, from ``cuda.bindings``."""
    if not _enums:
        from cuda.bindings import driver as d

        _enums.update(
            float16=int(d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16),
            bfloat16=int(d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16),
            float32=int(d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32),
            interleave=int(d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE),
            swizzle=int(d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B),
            promotion=int(d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B),
            fill=int(d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        )
    return _enums


def encode_tensor_map(
    ptr: int,
    rows: int,
    cols: int,
    row_bytes: int,
    dtype: str,
    box_rows: int,
    box_cols: int = 64,
    heads: int | None = None,
) -> bytes:
    """The 128 bytes of the TMA descriptor of the (rows, cols) array at ``ptr`` (checked by
    the caller: ``tma.check_tensor_map_args``), as ``tma.tensor_map`` encodes it. With
    ``heads``: the 3-D (heads, rows, cols) array of ``heads`` such arrays one after the
    other, boxes of (1, box_rows, box_cols), so that a box never crosses into the next
    head's rows (``_launch.dq_tensor_map``)."""
    e = _enum_values()
    out = (ctypes.c_uint64 * 16)()  # CUtensorMap: 128 bytes, 64-byte aligned by the driver's
    rank = 2 if heads is None else 3
    sizes, boxes = (cols, rows, heads)[:rank], (box_cols, box_rows, 1)[:rank]
    dims = (ctypes.c_uint64 * rank)(*sizes)  # innermost first
    strides = (ctypes.c_uint64 * (rank - 1))(*(row_bytes, rows * row_bytes)[: rank - 1])
    box = (ctypes.c_uint * rank)(*boxes)
    step = (ctypes.c_uint * rank)(*(1,) * rank)
    aligned = ctypes.addressof(out)
    if aligned % 64:  # the driver wants the map 64-byte aligned: use an aligned copy
        raw = (ctypes.c_char * 192)()
        aligned = (ctypes.addressof(raw) + 63) & ~63
    args = (
        aligned,
        e[dtype],
        rank,
        ptr,
        dims,
        strides,
        box,
        step,
        e["interleave"],
        e["swizzle"],
        e["promotion"],
        e["fill"],
    )
    rc = libcuda().cuTensorMapEncodeTiled(*args)
    if rc == CUDA_ERROR_INVALID_CONTEXT and make_context_current():
        rc = libcuda().cuTensorMapEncodeTiled(*args)
    if rc:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled failed: {error_string(rc)} (x shape {(rows, cols)})"
        )
    return ctypes.string_at(aligned, 128)
