"""What every recorded GPU run says about its software: the driver and the CUDA runtime."""

from __future__ import annotations


def _cuda_version(v: int) -> str:
    """CUDA's integer version (major * 1000 + minor * 10) as ``major.minor``."""
    return f"{v // 1000}.{v % 1000 // 10}"


def driver_version(runtime) -> str:
    """The NVIDIA driver's version from NVML (``580.159.04``); without pynvml, the CUDA
    version the driver supports, read through ``runtime`` (``cupy.cuda.runtime``)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return driver.decode() if isinstance(driver, bytes) else driver
    except Exception:  # no pynvml, or no NVML on this machine
        return f"CUDA driver API {_cuda_version(runtime.driverGetVersion())}"


def runtime_version(runtime) -> str:
    """The CUDA runtime's version, ``major.minor``."""
    return _cuda_version(runtime.runtimeGetVersion())
