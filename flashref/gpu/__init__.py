"""FlashAttention forward kernels for NVIDIA GPUs, as CuPy RawKernels.

The tiled algorithm of ``flashref.tiled_attention`` written in CUDA C, in
numbered versions that change one thing at a time (``VERSIONS``; the sources
are ``flashref/kernels/v*.cu``, compiled at run time by NVRTC through CuPy):

    from flashref.gpu import flash_attention
    O = flash_attention(q, k, v, causal=True)  # q, k, v: cupy arrays (..., N, d)

Conventions are those of ``flashref.tiled_attention``: ``scale`` defaults to
``1/sqrt(d)``, causal masking is aligned top-left (query i sees keys j <= i),
Nq may differ from Nk, a query that sees no key gets zeros and ``lse = -inf``,
and ``return_lse=True`` also returns the natural-log log-sum-exp in float32.

CuPy is imported only when a kernel is called, so ``import flashref.gpu``
works on any machine; calling without CuPy or without a GPU raises
``GPUUnavailableError`` saying what is missing and how to install it.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from pathlib import Path

from .._checks import check_flag, check_scale, check_shapes

KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels"

INSTALL_HINT = (
    "install CuPy for your CUDA driver with pip install 'flashref[cuda12]' "
    "(CUDA 12.x driver) or pip install 'flashref[cuda13]' (CUDA 13.x driver)"
)


class GPUUnavailableError(RuntimeError):
    """Raised when a kernel is called on a machine without CuPy or without a CUDA GPU."""


@dataclass(frozen=True)
class Version:
    """One kernel version: what it computes on, and how it is launched."""

    number: int
    name: str
    dtype: str  # "float16" or "float32": inputs, outputs; accumulation is always float32
    head_dims: tuple[int, ...]
    summary: str
    file: str  # under flashref/kernels/
    Br: int  # query rows per thread block
    threads: int  # threads per block

    @property
    def kernel(self) -> str:
        return f"flash_v{self.number}"

    @property
    def path(self) -> Path:
        return KERNEL_DIR / self.file

    def smem_bytes(self, d: int) -> int:
        """Dynamic shared memory per block, matching the layout in the .cu file."""
        if self.number == 1:  # Q (Br, d+1), K and V (Bc, d), S (Br, Bc+1); Br = Bc = 32
            return 4 * (32 * (d + 1) + 2 * 32 * d + 32 * 33)
        if self.number == 2:  # Q, K (64, d+1), V (64, d), S (64, 65), m, l, alpha (64,)
            return 4 * (2 * 64 * (d + 1) + 64 * d + 64 * 65 + 3 * 64)
        if self.number == 3:  # Q (Br, d), K and V (64, d), fp16
            return 2 * (self.Br + 2 * 64) * d
        if self.number == 4:  # the same with rows padded to d + 8
            return 2 * (self.Br + 2 * 64) * (d + 8)
        Bc = 32 if self.number >= 9 and d > 64 else 64
        stages = 3 if self.number >= 11 else 2  # buffers each of K and V
        return 2 * (self.Br + 2 * stages * Bc) * (d + 8)


_FP32_DIMS = tuple(range(1, 129))
_TC_DIMS = (64, 128)

VERSIONS: dict[int, Version] = {
    v.number: v
    for v in (
        Version(1, "scalar", "float32", _FP32_DIMS,
                "one thread per query row, K/V tiles in shared memory", "v1_scalar.cu", 32, 32),
        Version(2, "fa2_fp32", "float32", _FP32_DIMS,
                "FA-2 loop order: 8 warps share a 64 x 64 score tile, register blocking",
                "v2_fa2_fp32.cu", 64, 256),
        Version(3, "mma", "float16", _TC_DIMS,
                "tensor cores: mma.sync m16n8k16 + ldmatrix, softmax on fragments",
                "v3_mma.cu", 64, 128),
        Version(4, "padded", "float16", _TC_DIMS,
                "v3 + shared-memory rows padded by 8 halves (no ldmatrix bank conflicts)",
                "v4_padded.cu", 64, 128),
        Version(5, "cp_async", "float16", _TC_DIMS,
                "v4 + cp.async copies, double-buffered K/V tiles", "v5_cp_async.cu", 64, 128),
        Version(6, "exp2", "float16", _TC_DIMS,
                "v5 + ex2.approx with scale*log2(e) folded into one FMA", "v6_exp2.cu", 64, 128),
        Version(7, "q_regs", "float16", _TC_DIMS,
                "v6 + Q fragments loaded into registers once", "v7_q_regs.cu", 64, 128),
        Version(8, "br128", "float16", _TC_DIMS,
                "v7 with Br = 128 rows per block (8 warps)", "v8_br128.cu", 128, 256),
        Version(9, "warp32rows", "float16", _TC_DIMS,
                "v6 with 32 rows per warp (4 warps, Br = 128): each K/V fragment feeds 2 mma",
                "v9_warp32rows.cu", 128, 128),
        Version(10, "causal_order", "float16", _TC_DIMS,
                "v9 with the longest causal query blocks launched first",
                "v10_causal_order.cu", 128, 128),
        Version(11, "three_stage", "float16", _TC_DIMS,
                "v10 with three K/V buffers: copies two tiles ahead, one barrier per tile",
                "v11_three_stage.cu", 128, 128),
    )
}  # fmt: skip

# version=None picks the first version in this order that supports the dtype and head dim,
# ordered by TFLOP/s measured on the H200 at N = 4096 (python -m flashref.bench gpu), fastest
# first; a (dtype, d) entry overrides the dtype's. Versions 9 and 10 differ by less than the
# spread between two runs (each came first in some cases); 10 leads because it does the same
# work as 9 and only reorders the causal query blocks.
PREFERENCE: dict = {
    ("float16", 64): (10, 9, 11, 8, 6, 7, 5, 4, 3),
    ("float16", 128): (10, 9, 11, 6, 5, 4, 8, 7, 3),
    "float16": (10, 9, 11, 6, 8, 7, 5, 4, 3),
    "float32": (2, 1),
}


def gpu_unavailable_reason() -> str | None:
    """None if CuPy is installed and sees a CUDA GPU; otherwise what is missing, in words."""
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); {INSTALL_HINT}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, driver too old for this CuPy, no device node ...
        return (
            f"CuPy cannot reach a CUDA GPU ({type(exc).__name__}: {exc}); flashref.gpu needs "
            f"an NVIDIA GPU with a working driver and the matching CuPy: {INSTALL_HINT}"
        )
    if count < 1:
        return "CUDA reports no GPU on this machine; flashref.gpu needs an NVIDIA GPU"
    return None


def available() -> bool:
    """True when the kernels can run here (CuPy installed, a CUDA GPU visible)."""
    return gpu_unavailable_reason() is None


def _require_gpu():
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise GPUUnavailableError(f"flashref.gpu cannot run: {reason}")
    import cupy

    return cupy


def _check_version(version, dtype: str, d: int) -> Version:
    if version is None:
        order = PREFERENCE.get((dtype, d), PREFERENCE.get(dtype, ()))
        for number in order:
            if d in VERSIONS[number].head_dims:
                return VERSIONS[number]
        dims = sorted({x for n in order for x in VERSIONS[n].head_dims})
        if not dims:
            raise ValueError(f"q has dtype {dtype}; flashref.gpu supports float16 and float32")
        text = f"{dims[0]}..{dims[-1]}" if len(dims) > 8 else ", ".join(map(str, dims))
        raise ValueError(f"q has head dim d={d}; the {dtype} kernels support d in {text}")
    if isinstance(version, bool) or not isinstance(version, numbers.Integral):
        raise TypeError(f"version must be an int or None, got {type(version).__name__}")
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {sorted(VERSIONS)} or None, got {version}")
    v = VERSIONS[int(version)]
    if dtype != v.dtype:
        others = [n for n, w in VERSIONS.items() if w.dtype == dtype]
        raise ValueError(
            f"version {v.number} ({v.name}) takes {v.dtype} inputs but q is {dtype}; "
            f"use version {others} or convert with q.astype('{v.dtype}')"
        )
    if d not in v.head_dims:
        dims = f"{v.head_dims[0]}..{v.head_dims[-1]}" if len(v.head_dims) > 8 else v.head_dims
        raise ValueError(f"q has head dim d={d}; version {v.number} supports d in {dims}")
    return v


def _check_inputs(q, k, v, causal, scale, return_lse):
    """Shape, dtype and argument checks that need no GPU; returns (dtype, d, scale).

    ``causal``, ``return_lse`` and ``scale`` follow the NumPy functions' rules
    (``check_flag``, ``check_scale``); the kernels accumulate in float32.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "ndim")):
            raise TypeError(f"{name} must be a cupy.ndarray, got {type(x).__name__}")
    check_shapes(q, k, v)  # the same shape rules, and messages, as the NumPy functions
    d = q.shape[-1]
    if v.shape[-1] != d:
        raise ValueError(
            f"v has shape {v.shape}; these kernels need v's head dim equal to q's, {d}"
        )
    dtypes = {str(x.dtype) for x in (q, k, v)}
    if len(dtypes) != 1:
        raise TypeError(
            f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype} (no implicit casts)"
        )
    dtype = dtypes.pop()
    if dtype not in ("float16", "float32"):
        raise TypeError(f"q has dtype {dtype}; flashref.gpu supports float16 and float32")
    check_flag(causal, "causal")
    check_flag(return_lse, "return_lse")
    return dtype, d, check_scale(scale, d, "float32")


def flash_attention(q, k, v, *, causal=False, scale=None, version=None, return_lse=False, out=None):
    """Attention ``softmax(scale * Q K^T) V`` on the GPU, tiled FlashAttention style.

    Args:
        q: cupy array (..., Nq, d); k: (..., Nk, d); v: (..., Nk, d); one dtype,
            float16 (tensor-core versions) or float32 (versions 1 and 2).
        causal: top-left causal mask (query i sees keys j <= i); a bool.
        scale: score scale, default ``1/sqrt(d)``; a real number, finite, nonzero
            and within float32's range (negative allowed), as on the CPU.
        version: a key of ``VERSIONS``, or None for the fastest that supports
            the dtype and head dim.
        return_lse: a bool; also return ``lse (..., Nq)`` in float32.
        out: optional contiguous cupy array (..., Nq, d) of q's dtype to write O into.

    Returns ``O (..., Nq, d)`` in q's dtype, or ``(O, lse)``.
    """
    dtype, d, scale = _check_inputs(q, k, v, causal, scale, return_lse)
    ver = _check_version(version, dtype, d)
    cp = _require_gpu()
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, cp.ndarray):
            raise TypeError(
                f"{name} must be a cupy.ndarray, got {type(x).__name__} (use cupy.asarray)"
            )
    lead, Nq = tuple(q.shape[:-2]), q.shape[-2]
    if out is not None:
        if not isinstance(out, cp.ndarray) or out.shape != (*lead, Nq, d) or out.dtype != q.dtype:
            raise ValueError(
                f"out must be a cupy array of shape {(*lead, Nq, d)} and dtype {dtype}, got "
                f"{type(out).__name__} {getattr(out, 'shape', '')} {getattr(out, 'dtype', '')}"
            )
        if not out.flags.c_contiguous:
            raise ValueError("out must be C-contiguous")
        O = out
    else:
        O = cp.empty((*lead, Nq, d), dtype=q.dtype)
    lse = cp.empty((*lead, Nq), dtype=cp.float32)

    from ._launch import launch

    launch(ver, q, k, v, O, lse, causal=causal, scale=scale)
    return (O, lse) if return_lse else O


__all__ = [
    "GPUUnavailableError",
    "PREFERENCE",
    "VERSIONS",
    "Version",
    "available",
    "flash_attention",
    "gpu_unavailable_reason",
]
