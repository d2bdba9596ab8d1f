r"""The host side of a call: from the caller's arrays to a launch, with no copy and no sync.

Every GPU entry point takes CuPy arrays or torch CUDA tensors. What it does with them here:

* **One plan per call signature.** Each entry point (the forward, the backward, decode,
  paged decode, the paged prefill) keys its call by ``signature`` (types, shapes, dtypes,
  device, options) in a ``Kept`` of plans: the first call of a signature makes every check
  and decision once (a subclass of ``Plan``: the backend, the device, the version, the
  compiled kernels from ``flashref.gpu._launch.compiled``, the grid and scalar arguments),
  and every call runs the plan: it reads the arrays' ``addresses`` (contiguous and aligned,
  or the general route copies them first), allocates the outputs and ``launch``\ es. The
  device paged cache is its appends' plan.

* **Where it runs.** CuPy arrays run on CuPy's current device and stream, torch tensors on
  the tensor's device and torch's current stream there
  (``torch.cuda.current_stream``), so a call is ordered with the model's other work and is
  captured by ``torch.cuda.graph`` like any torch operation.
* **Memory.** Outputs and temporaries of a torch call come from torch's caching allocator
  (which knows about graph capture and streams); those of a CuPy call from CuPy's pool.
  ``Torch.scope`` makes CuPy code inside a torch call use torch's stream and allocator, for
  the paths that are written with CuPy operations (grouped heads, a negative scale, inputs
  that must be copied first).
* **Views, not DLPack.** A torch tensor is seen by CuPy as an array over the same memory
  (``Torch.view``: address, shape, strides and dtype, a few microseconds), and a kernel takes
  the address itself as an int. ``torch.from_dlpack`` and ``cupy.from_dlpack`` query devices
  and streams on every call, which costs tens of microseconds a tensor.
* **Streams as addresses.** A kernel is launched on the stream's handle (``stream_ptr``).
* **Launches through the driver.** A planned call launches with ``launcher``: the kernel's
  ``cuLaunchKernel`` with its arguments packed in one buffer (``flashref.gpu._driver.Launcher``:
  CuPy's compiled binding of the driver function, or ``ctypes``), their kinds read from the
  first call's values, instead of ``RawKernel.__call__``'s conversions.

Nothing here reads GPU memory on the host: no call synchronises.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

from ._driver import Launcher, kinds_of
from ._runtime import is_torch_tensor as is_torch


def signature(arrays, scalars):
    """The key of a call, the one memo of every plan (``Kept``): each array's type, shape and
    dtype (None for one not given; a torch tensor's device too), CuPy's current device for a
    CuPy call, each scalar with its type (``True`` and ``1``, ``1`` and ``1.0`` are checked
    differently). A host table in a call of device arrays (a NumPy block table) is keyed by
    its type, shape and dtype: its values are read by the plan's ``run``. None where the key
    cannot be built or hashed (a list, an object without a shape): the checks then run and
    say what is wrong. Built with as few Python steps as it can: every planned call pays
    for it."""
    try:
        if is_torch(arrays[0]):  # every tensor's device (a host table has none)
            parts = [
                None
                if x is None
                else (
                    type(x),
                    x.shape,
                    x.dtype,
                    x.get_device() if hasattr(x, "get_device") else None,
                )
                for x in arrays
            ]
        else:
            cupy = sys.modules.get("cupy")  # not imported yet: no plan was made (device None)
            parts = [None if x is None else (type(x), x.shape, x.dtype) for x in arrays]
            parts.append(None if cupy is None else cupy.cuda.runtime.getDevice())
        parts.append(tuple([(type(s), s) for s in scalars]))
        key = tuple(parts)
        hash(key)
    except Exception:
        return None
    return key


def dims3(t) -> tuple[int, int, int]:
    """A grid or block of 1 to 3 dimensions as the 3 the driver takes."""
    return (*t, 1, 1)[:3]


def launcher(kernel, args):
    """The ``_driver.Launcher`` of ``kernel`` (a CuPy ``RawKernel`` on the current device) for
    arguments of the kinds of ``args`` (``_driver.kinds_of``)."""

    return Launcher(kernel, kinds_of(args))


class Kept:
    r"""What a call signature needs, made once (checked plans), at most ``kept`` of them: the
    oldest is dropped first. A key of None is never kept. An entry point reads
    ``get(key)`` and, on a miss, ``put``\ s the plan it makes (a plan that raised is not
    kept)."""

    def __init__(self, kept: int = 256):
        self.kept, self.items = kept, {}

    def get(self, key):
        return None if key is None else self.items.get(key)

    def put(self, key, value):
        if key is not None:
            if len(self.items) >= self.kept:
                self.items.pop(next(iter(self.items)))
            self.items[key] = value
        return value


class Plan:
    """What every plan of a call signature shares: the backend of its arrays (``CuPy`` or
    ``Torch``), the device its kernels were compiled for, and one ``_driver.Launcher`` per
    kernel, made at its first launch from that launch's arguments (their kinds do not change
    within a signature). The forward's, the backward's, decode's, the paged prefill's and
    the device cache's plans are made on it."""

    def __init__(self, cp, backend, device: int | None = None):
        self.cp, self.backend = cp, backend
        # the device made current around the launches: a torch plan's tensors' device, or
        # ``device``; None for a CuPy call's plan, which runs on CuPy's current device (its
        # signature holds that device)
        self.pinned = backend.device if device is None else device
        self.device = self.pinned if self.pinned is not None else cp.cuda.runtime.getDevice()
        self.launchers: dict = {}

    def on_device(self):
        """The plan's device made current around its launches, where it is pinned to one."""
        return _UNCHANGED if self.pinned is None else device_scope(self.cp, self.pinned)

    def addresses(self, arrays, align=16):
        """The arrays' addresses where each is C-contiguous and aligned as the kernels' loads
        need (``align`` bytes for all, or one alignment per array), else None: the caller
        copies them first (its general route). An array given as None has address 0 (a null
        pointer: a table the call does not have)."""
        b = self.backend
        contiguous = b.contiguous
        for x in arrays:
            if x is not None and not contiguous(x):
                return None
        ptr = b.ptr
        ptrs = [0 if x is None else ptr(x) for x in arrays]
        if type(align) is int:
            for p in ptrs:
                if p % align:
                    return None
        else:
            for p, a in zip(ptrs, align, strict=True):
                if p % a:
                    return None
        return ptrs

    def launch(self, fn, grid, block, smem: int, stream: int, args) -> None:
        """``fn`` on ``grid`` x ``block`` with ``smem`` bytes of dynamic shared memory, on the
        stream of handle ``stream`` (inside ``on_device``)."""
        try:
            run = self.launchers[fn]
        except KeyError:
            run = self.launchers[fn] = launcher(fn, args)
        run(grid, block, smem, stream, args)


_UNCHANGED = contextlib.nullcontext()  # reusable: it holds nothing


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:  # CuPy without bfloat16 support: the DLPack route is taken instead
        return None
    return np.dtype(ml_dtypes.bfloat16)


class CuPy:
    """CuPy arrays in and out: CuPy's current device, stream and memory pool."""

    kind = "cupy"

    def __init__(self, cp):
        self.cp = cp
        self.device = None  # CuPy's current device

    def stream_ptr(self) -> int:
        return self.cp.cuda.get_current_stream().ptr

    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype=dtype)

    @staticmethod
    def ptr(x) -> int:
        return x.data.ptr

    @staticmethod
    def contiguous(x) -> bool:
        return x.flags.c_contiguous

    @staticmethod
    def view(x):
        return x

    def scope(self):
        return contextlib.nullcontext()


class Torch:
    """torch CUDA tensors in and out: the tensors' device, torch's current stream there, and
    torch's caching allocator (one per device, kept by ``torch_backend``)."""

    kind = "torch"

    def __init__(self, cp, torch, device: int):
        self.cp, self.torch, self.device = cp, torch, device
        self._raw_stream = torch._C._cuda_getCurrentRawStream
        self._dev = torch.device("cuda", device)
        self._cupy_streams: dict = {}
        bf16 = _bfloat16()
        self._np = {
            torch.float16: np.dtype(np.float16),
            torch.float32: np.dtype(np.float32),
            torch.int32: np.dtype(np.int32),
            torch.int64: np.dtype(np.int64),
            torch.uint8: np.dtype(np.uint8),
        }
        if bf16 is not None:
            self._np[torch.bfloat16] = bf16
        self._torch_dtype = {v: k for k, v in self._np.items()}
        self._torch_dtype.update(
            {
                "float16": torch.float16,
                "float32": torch.float32,
                "bfloat16": torch.bfloat16,
                "int32": torch.int32,
            }
        )

    def stream_ptr(self) -> int:
        return self._raw_stream(self.device)

    def empty(self, shape, dtype):
        """A new tensor on this device; ``dtype`` a name, a NumPy dtype or a torch dtype."""
        return self.torch.empty(shape, dtype=self._torch_dtype.get(dtype, dtype), device=self._dev)

    @staticmethod
    def ptr(x) -> int:
        return x.data_ptr()

    @staticmethod
    def contiguous(x) -> bool:
        return x.is_contiguous()

    def view(self, x):
        """A CuPy array over ``x``'s memory (no copy; ``x`` is kept alive by the view)."""
        cp = self.cp
        dtype = self._np.get(x.dtype)
        if dtype is None:  # a dtype this table lacks: DLPack knows it
            return cp.from_dlpack(x.detach())
        n = x.numel()
        span = sum((s - 1) * t for s, t in zip(x.shape, x.stride(), strict=True)) + 1
        nbytes = 0 if n == 0 else span * dtype.itemsize
        mem = cp.cuda.UnownedMemory(x.data_ptr(), nbytes, x, self.device)
        strides = tuple(t * dtype.itemsize for t in x.stride())
        return cp.ndarray(tuple(x.shape), dtype, cp.cuda.MemoryPointer(mem, 0), strides)

    def _allocate(self, nbytes: int):
        t = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self._dev)
        cp = self.cp
        return cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(t.data_ptr(), nbytes, t, self.device), 0)

    def _cupy_stream(self, ptr: int):
        """CuPy's stream object for torch's stream ``ptr``, made once per stream."""
        s = self._cupy_streams.get(ptr)
        if s is None:
            import warnings

            with warnings.catch_warnings():  # CuPy 14 prefers Stream.from_external(protocol)
                warnings.simplefilter("ignore", DeprecationWarning)
                s = self._cupy_streams[ptr] = self.cp.cuda.ExternalStream(ptr, self.device)
        return s

    @contextlib.contextmanager
    def scope(self):
        """CuPy code inside runs on this device, on torch's current stream, with memory from
        torch's allocator (so it is ordered with torch's work and can be graph-captured)."""
        cp = self.cp
        stream = self._cupy_stream(self._raw_stream(self.device))
        with cp.cuda.Device(self.device), stream, cp.cuda.using_allocator(self._allocate):
            yield


_torch_backends: dict[int, Torch] = {}


def torch_backend(cp, x) -> Torch:
    """The ``Torch`` of ``x``'s device (``x`` a CUDA tensor)."""
    dev = x.get_device()
    b = _torch_backends.get(dev)
    if b is None:
        import torch

        b = _torch_backends[dev] = Torch(cp, torch, dev)
    return b


_cupy_backend: list[CuPy] = []  # made on first use (CuPy imported then)


def cupy_backend(cp) -> CuPy:
    if not _cupy_backend:
        _cupy_backend.append(CuPy(cp))
    return _cupy_backend[0]


def device_scope(cp, device):
    """Makes ``device`` (an int) current for a launch, where it is not already."""
    if device is None or cp.cuda.runtime.getDevice() == device:
        return contextlib.nullcontext()
    return cp.cuda.Device(device)


def check_torch_tensors(named, device: int | None = None) -> int:
    """Each ``(name, tensor)`` a CUDA tensor, all on one device (that of the first, or
    ``device``); returns the device index. The error names the tensor."""
    first = named[0][1].get_device() if device is None else device
    for name, x in named:
        dev = x.get_device()
        if dev < 0:
            raise TypeError(f"{name} is a torch tensor on {x.device}; move it to the GPU first")
        if dev != first:
            raise ValueError(
                f"{name} is on cuda:{dev} but {named[0][0]} is on cuda:{first}; use one device"
            )
    return first


def check_tables(b, q, named) -> None:
    """Device tables ``(name, x)`` (None: not given) of the kind of ``b``, the backend of
    ``q``'s call, on ``q``'s device: the kernels read them where they are."""
    for name, x in named:
        if x is None:
            continue
        if (b.kind == "torch") != is_torch(x):
            raise TypeError(
                f"{name} is a {type(x).__module__.split('.')[0]} array but q is a "
                f"{b.kind} one; pass device tables of q's kind, or host arrays"
            )
        if b.kind == "torch":
            check_torch_tensors((("q", q), (name, x)))


def backend_of(cp, arrays):
    """The backend of a call's arrays ``((name, x), ...)``: all CuPy, or all torch CUDA
    tensors on one device (the error names the first that is not)."""
    first = arrays[0][1]
    if is_torch(first):
        for name, x in arrays:
            if not is_torch(x):
                raise TypeError(
                    f"{name} must be a torch CUDA tensor like {arrays[0][0]}, got "
                    f"{type(x).__name__} (pass all torch tensors or all CuPy arrays)"
                )
        check_torch_tensors(arrays)
        return torch_backend(cp, first)
    for name, x in arrays:
        if not isinstance(x, cp.ndarray):
            if is_torch(x):
                raise TypeError(
                    f"{name} is a torch tensor but {arrays[0][0]} is a cupy.ndarray "
                    "(pass all torch tensors or all CuPy arrays)"
                )
            raise TypeError(
                f"{name} must be a cupy.ndarray or a torch CUDA tensor, got "
                f"{type(x).__name__} (use cupy.asarray)"
            )
    return cupy_backend(cp)


def memset_zero(cp, ptr: int, nbytes: int, stream: int) -> None:
    """Zero ``nbytes`` at ``ptr`` on the stream of handle ``stream`` (a memset a graph can
    capture)."""
    if nbytes:
        cp.cuda.runtime.memsetAsync(ptr, 0, nbytes, stream)
