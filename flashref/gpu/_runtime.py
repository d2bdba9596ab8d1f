"""What every GPU entry point needs before and around a launch: CuPy, the device, the inputs.

Whether CuPy and a GPU are there (``gpu_unavailable_reason``, ``available``,
``require_gpu`` raising ``GPUUnavailableError``), the device's compute capability and whether
a version's instructions exist on it (``check_capability``), and the input checks that need
no GPU (``check_inputs``); how arrays reach a launch is ``_host``. The forward, backward
and decode modules import it; it imports none of them. CuPy is imported only inside the
functions, so ``import flashref.gpu`` works on any machine.
"""

from __future__ import annotations

from .._checks import causal_top_left, check_causal, check_flag, check_scale, check_shapes

INSTALL_HINT = (
    "install CuPy for your CUDA driver: in the repository, pip install -e '.[cuda12]' "
    "(CUDA 12.x driver, CuPy's package cupy-cuda12x) or pip install -e '.[cuda13]' "
    "(CUDA 13.x driver, cupy-cuda13x)"
)
DRIVER_LIBRARIES = ("libcuda.so.1", "nvcuda.dll")  # the NVIDIA driver's, on Linux and Windows


def driver_library() -> str | None:
    """The name of the NVIDIA driver's library where it can be loaded, else None (no driver
    installed: CUDA's runtime then reports an "insufficient" driver, which misleads)."""
    import ctypes

    for name in DRIVER_LIBRARIES:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return None


class GPUUnavailableError(RuntimeError):
    """Raised when a kernel is called on a machine without CuPy or without a CUDA GPU."""


DTYPES = ("float16", "bfloat16", "float32")


def gpu_unavailable_reason() -> str | None:
    """None if CuPy is installed and sees a CUDA GPU; otherwise what is missing, in words."""
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); {INSTALL_HINT}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, driver too old for this CuPy, no device node ...
        if driver_library() is None:
            return (
                "no NVIDIA driver on this machine (none of "
                f"{', '.join(DRIVER_LIBRARIES)} can be loaded); flashref.gpu needs an NVIDIA "
                "GPU and its driver"
            )
        return (
            f"CuPy cannot reach a CUDA GPU ({type(exc).__name__}: {exc}); flashref.gpu needs "
            f"an NVIDIA GPU with a working driver and the matching CuPy: {INSTALL_HINT}"
        )
    if count < 1:
        return "CUDA reports no GPU on this machine; flashref.gpu needs an NVIDIA GPU"
    try:  # the kernels are compiled at run time: without NVRTC the first call would fail
        cupy.cuda.nvrtc.getVersion()
    except Exception as exc:  # libnvrtc not found, or too old for this CuPy
        return (
            f"CuPy cannot load NVRTC, the CUDA compiler the kernels are built with at run "
            f"time ({type(exc).__name__}: {exc}); {INSTALL_HINT} (those extras bring CuPy's "
            "CUDA libraries, NVRTC among them, through cupy's [ctk] extra)"
        )
    return None


def available() -> bool:
    """True when the kernels can run here (CuPy installed, a CUDA GPU visible)."""
    return gpu_unavailable_reason() is None


def require_gpu():
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise GPUUnavailableError(f"flashref.gpu cannot run: {reason}")
    import cupy

    return cupy


def device_cc(cp) -> tuple[int, int]:
    """The current device's compute capability as (major, minor)."""
    major, minor = divmod(int(cp.cuda.Device().compute_capability), 10)
    return major, minor


def check_capability(cp, ver) -> None:
    """The version's instructions must exist on this GPU: a clear error, not an NVRTC failure."""
    dev = cp.cuda.Device()
    cc = device_cc(cp)
    if not ver.runs_on(cc):
        name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
        what = f"{getattr(ver, 'kind', '')}version {ver.number} ({ver.name})"
        if ver.arch:
            raise RuntimeError(
                f"{what} is built for {ver.arch} and needs compute "
                f"capability {ver.min_cc[0]}.{ver.min_cc[1]} exactly; this GPU ({name}) has "
                f"{cc[0]}.{cc[1]}"
            )
        raise RuntimeError(
            f"{what} needs compute capability "
            f"{ver.min_cc[0]}.{ver.min_cc[1]} or higher; this GPU ({name}) has {cc[0]}.{cc[1]}"
        )


def dtype_name(x) -> str:
    """'float16', 'bfloat16', ... for CuPy arrays and torch tensors alike."""
    return str(x.dtype).removeprefix("torch.")


def is_torch_tensor(x) -> bool:
    """Whether ``x``'s type is torch's (torch is never imported here to find out)."""
    m = type(x).__module__
    return m == "torch" or m.startswith("torch.")


def check_inputs(q, k, v, causal, scale, return_lse, where="flash_attention"):
    """Shape, dtype and argument checks that need no GPU; returns (dtype, d, scale, G).

    ``causal``, ``return_lse`` and ``scale`` follow the NumPy functions' rules
    (``check_causal`` and ``causal_top_left``: the kernels mask top-left, ``"bottom_right"``
    taken where it is the same mask; ``check_flag``, ``check_scale``); the kernels accumulate
    in float32. ``G = Hq // Hkv`` is the grouped-query group size (1 without grouping),
    under the NumPy functions' rules. ``where`` names the caller in the errors.
    """
    check_causal(causal)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "ndim")):
            raise TypeError(
                f"{name} must be a cupy.ndarray or a torch CUDA tensor, got {type(x).__name__}"
            )
    G = check_shapes(q, k, v)  # the same shape rules, and messages, as the NumPy functions
    d = q.shape[-1]
    if v.shape[-1] != d:
        raise ValueError(
            f"v has shape {tuple(v.shape)}; these kernels need v's head dim equal to q's, {d}"
        )
    dtypes = {dtype_name(x) for x in (q, k, v)}
    if len(dtypes) != 1:
        raise TypeError(
            f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype} (no implicit casts)"
        )
    dtype = dtypes.pop()
    if dtype not in DTYPES:
        raise TypeError(f"q has dtype {dtype}; flashref.gpu supports {', '.join(DTYPES)}")
    causal_top_left(causal, q.shape[-2], k.shape[-2], f"{where}'s kernels")
    check_flag(return_lse, "return_lse")
    return dtype, d, check_scale(scale, d, "float32"), G
