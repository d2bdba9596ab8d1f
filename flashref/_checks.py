"""Input validation shared by every public function.

Every check runs before any arithmetic, and every message names the argument
and the shapes or dtypes involved, so a reader who passes the wrong thing is
told what and where.
"""

from __future__ import annotations

import numbers

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def as_float_array(x, name: str) -> np.ndarray:
    """Return ``x`` as an ndarray, raising TypeError unless it holds float16/32/64."""
    arr = np.asarray(x)
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} has dtype {arr.dtype}; expected float16, float32 or float64")
    return arr


def accumulation_dtype(dtype: np.dtype) -> np.dtype:
    """float64 stays float64; float16 and float32 accumulate in float32."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def check_axis(axis, ndim: int, name: str = "x") -> int:
    """Normalise ``axis`` to a non-negative int for an array of rank ``ndim``."""
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for {name} with {ndim} dimension(s)")
    return int(axis) % ndim


def check_block(size, name: str) -> int:
    """A tile or block size: an int of at least 1."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(size).__name__}")
    if size < 1:
        raise ValueError(f"{name} must be >= 1, got {size}")
    return int(size)


def check_flag(value, name: str) -> bool:
    """A yes/no option such as ``causal``: a Python or NumPy bool, returned as a Python bool.

    Anything else (``"yes"``, 1, None) is refused rather than read by its truthiness.
    """
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_scale(scale, d: int) -> float:
    """The softmax scale: ``1/sqrt(d)`` by default, otherwise a real number."""
    if scale is None:
        return 1.0 / float(np.sqrt(d))
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    return float(scale)


def check_shapes(q, k, v) -> None:
    """The shape rules of attention, for any arrays with a ``.shape`` (NumPy or CuPy).

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv) with identical leading
    (batch/head) dimensions: no broadcasting, no grouped heads; d >= 1.
    """
    for name, arr in (("q", q), ("k", k), ("v", v)):
        if arr.ndim < 2:
            raise ValueError(
                f"{name} has shape {arr.shape}; expected at least 2 dimensions (..., N, d)"
            )
    if not (q.ndim == k.ndim == v.ndim):
        raise ValueError(
            f"q, k and v must have the same rank; got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2]:
        raise ValueError(
            f"leading (batch/head) dimensions must be equal: q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if q.shape[-1] < 1:
        raise ValueError(f"q has shape {q.shape}; the head dim d must be >= 1")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k has shape {k.shape} but q has head dim {q.shape[-1]}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v has shape {v.shape} but k has {k.shape[-2]} keys; v must be (..., Nk, dv)"
        )


def check_qkv(q, k, v):
    """Validate attention inputs; return them as arrays plus the output dtype.

    Float16/32/64 arrays with the shapes of ``check_shapes``.
    """
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    check_shapes(q, k, v)
    out_dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    return q, k, v, out_dtype


def check_mask(mask, q: np.ndarray, k: np.ndarray):
    """A boolean mask broadcastable to (..., Nq, Nk); True means "may attend"."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"mask has dtype {mask.dtype}; expected bool (True = may attend)")
    target = q.shape[:-1] + (k.shape[-2],)
    try:
        ok = np.broadcast_shapes(mask.shape, target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask has shape {mask.shape}, which does not broadcast to the scores' "
            f"shape {target} (..., Nq, Nk) for q {q.shape} and k {k.shape}"
        )
    return np.broadcast_to(mask, target)  # a view: no (Nq, Nk) copy is made
