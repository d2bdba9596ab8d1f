"""A stand-in for CuPy and the CUDA driver, so that the GPU entry points run on a CPU.

``installed()`` puts a module named ``cupy`` in ``sys.modules`` whose arrays are NumPy's (a
subclass with CuPy's ``data.ptr``, reporting the module ``cupy``), whose device is one GPU of
compute capability 9.0 and 132 SMs, whose ``RawModule`` compiles nothing, and whose kernels,
the driver's launches (``flashref.gpu._host.Launcher``), ``memsetAsync`` and TMA descriptors
(``flashref.gpu._driver.encode_tensor_map``) are recorded in ``LOG`` instead of run. A call
then goes through every check, plan, allocation and argument of its host path, and the log
says which kernels it launched, on what grid and block, with how much shared memory and
which arguments: what the host path decides, with no result computed (the outputs hold
whatever the allocation held).

``normalised(LOG)`` names each address by the order it first appears in (``@0``, ``@1``, ...),
so that two runs whose allocations land elsewhere compare equal where their launches are.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types

import numpy as np

LOG: list = []
ADDRESS = 1 << 20  # a Python int this large in a launch's arguments is an address


class ndarray(np.ndarray):
    """A NumPy array that CuPy's attributes and the module name ``cupy`` report."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def get(self):
        return np.asarray(self)


ndarray.__module__ = "cupy"


def _dev(x):
    return x.view(ndarray) if isinstance(x, np.ndarray) else x


def asarray(x, dtype=None):
    return _dev(np.asarray(x, dtype=dtype))


def ascontiguousarray(x):
    return x if x.flags.c_contiguous else _dev(np.ascontiguousarray(x))


def empty(shape, dtype=np.float32):
    return _dev(np.full(shape, 0x55 if np.dtype(dtype).kind in "iu" else np.nan, dtype))


def zeros(shape, dtype=np.float32):
    return _dev(np.zeros(shape, dtype))


def full(shape, value, dtype=np.float32):
    return _dev(np.full(shape, value, dtype))


def asnumpy(x):
    return np.asarray(x)


class RawKernel:
    def __init__(self, name, module):
        self.name, self.module = name, module
        self.kernel = types.SimpleNamespace(ptr=id(self))
        self.max_dynamic_shared_size_bytes = 0

    def __call__(self, grid, block, args, shared_mem=0):
        LOG.append(["cupy", self.name, tuple(grid), tuple(block), shared_mem, list(args)])


class RawModule:
    def __init__(self, code="", options=()):
        self.options = tuple(options)
        LOG.append(["compile", len(code), list(self.options)])

    def get_function(self, name):
        return RawKernel(name, self)


class Launcher:
    """``flashref.gpu._driver.Launcher``'s stand-in: records each launch."""

    def __init__(self, kernel, kinds):
        self.kernel, self.kinds = kernel, kinds

    def __call__(self, grid, block, shared_mem, stream, args):
        LOG.append(["driver", self.kernel.name, tuple(grid), tuple(block), shared_mem, list(args)])


def encode_tensor_map(ptr, rows, cols, row_bytes, dtype, box_rows, box_cols=64, heads=None):
    text = json.dumps(["map", ptr, rows, cols, row_bytes, dtype, box_rows, box_cols, heads])
    return text.encode().ljust(128, b" ")


class _Device:
    id = 0
    compute_capability = "90"
    attributes = {"MultiProcessorCount": 132}

    def __init__(self, i=0):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _memset(ptr, value, nbytes, stream):
    LOG.append(["memset", ptr, value, nbytes, stream])


def module() -> types.ModuleType:
    cp = types.ModuleType("cupy")
    cp.ndarray, cp.asarray, cp.ascontiguousarray = ndarray, asarray, ascontiguousarray
    cp.empty, cp.zeros, cp.full, cp.asnumpy = empty, zeros, full, asnumpy
    cp.RawModule, cp.RawKernel = RawModule, RawKernel
    for name in ("float16", "float32", "int32", "int64", "uint8", "uint16", "uint32"):
        setattr(cp, name, getattr(np, name))
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        getDevice=lambda: 0,
        getDeviceProperties=lambda i: {"name": b"CPU stand-in (cc 9.0, 132 SMs)"},
        memsetAsync=_memset,
    )
    stream = types.SimpleNamespace(ptr=0)
    cp.cuda = types.SimpleNamespace(
        runtime=runtime,
        nvrtc=types.SimpleNamespace(getVersion=lambda: (13, 0)),
        Device=_Device,
        get_current_stream=lambda: stream,
    )
    return cp


def _forget() -> None:
    """Drop what flashref's GPU modules keep between calls (plans, backends, buffers,
    compiled kernels), so that nothing made with the stand-in outlives it, nor with CuPy
    before it."""
    import importlib

    host = importlib.import_module("flashref.gpu._host")
    host._cupy_backend.clear()
    host._torch_backends.clear()
    for name in ("forward", "backward", "decode.api", "decode.prefill"):
        plans = getattr(importlib.import_module(f"flashref.gpu.{name}"), "_PLANS", None)
        if plans is not None:
            plans.items.clear()
    buffers = sys.modules.get("flashref.gpu.decode.buffers")
    for store in ("_partials", "_counters"):
        getattr(buffers, store, {}).clear()
    for name in [n for n in sys.modules if n.startswith("flashref.gpu._launch")]:
        del sys.modules[name]


@contextlib.contextmanager
def installed():
    """The stand-in in place (CuPy, the driver's launches and descriptors), ``LOG`` emptied;
    what flashref's GPU modules keep between calls is dropped on the way in and out."""
    import flashref.gpu._driver as driver
    import flashref.gpu._host as host
    import flashref.gpu.tma as tma

    saved = {n: m for n, m in sys.modules.items() if n == "cupy" or n.startswith("cupy.")}
    kept = host.Launcher, driver.encode_tensor_map, tma.encode_tensor_map
    _forget()
    sys.modules["cupy"] = module()
    host.Launcher = Launcher
    driver.encode_tensor_map = tma.encode_tensor_map = encode_tensor_map
    LOG.clear()
    try:
        yield LOG
    finally:
        host.Launcher, driver.encode_tensor_map, tma.encode_tensor_map = kept
        sys.modules.pop("cupy", None)
        sys.modules.update(saved)
        _forget()


def normalised(log) -> list:
    """The log with each address named by its first appearance, each NumPy scalar as its type
    and value, each array as its shape and dtype, each descriptor decoded."""
    names: dict[int, str] = {}

    def addr(p: int) -> str:
        return names.setdefault(p, f"@{len(names)}")

    def one(x):
        if isinstance(x, bool) or x is None or isinstance(x, str | float):
            return x
        if isinstance(x, int):
            return addr(x) if x >= ADDRESS else x
        if isinstance(x, np.void | bytes):  # a descriptor
            raw = bytes(x).rstrip(b" \x00")
            kind, ptr, *rest = json.loads(raw)
            return [kind, addr(ptr), *rest]
        if isinstance(x, np.generic):
            return f"{x.dtype}:{x.item()}"
        if isinstance(x, np.ndarray):
            return [addr(x.__array_interface__["data"][0]), list(x.shape), str(x.dtype)]
        if isinstance(x, list | tuple):
            return [one(y) for y in x]
        return repr(x)

    return [one(entry) for entry in log]
