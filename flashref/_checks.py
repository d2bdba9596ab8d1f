"""Input validation shared by every public function.

Every check runs before any arithmetic, and every message names the argument
and the shapes or dtypes involved, so a reader who passes the wrong thing is
told what and where.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def masked_error(name: str) -> TypeError:
    """The refusal of a ``numpy.ma.MaskedArray`` given as ``name``: ``np.asarray`` would drop
    its mask without a word (``refuse_masked``; the GPU's host tables raise it too)."""
    return TypeError(
        f"{name} is a numpy.ma.MaskedArray, whose mask would be ignored; "
        f"pass a plain ndarray such as {name}.filled(value)"
    )


def refuse_masked(x, name: str) -> None:
    """A ``numpy.ma.MaskedArray`` is refused (``masked_error``)."""
    if isinstance(x, np.ma.MaskedArray):
        raise masked_error(name)


def _asarray(x, name: str) -> np.ndarray:
    """``np.asarray(x)``, with the argument named when NumPy cannot convert ``x``.

    Masked arrays are refused (``refuse_masked``).
    """
    refuse_masked(x, name)
    try:
        return np.asarray(x)
    except Exception as exc:  # ragged lists, objects whose __array__ refuses ...
        kind = ValueError if isinstance(exc, ValueError) else TypeError
        raise kind(
            f"{name} cannot be converted to a NumPy array ({type(exc).__name__}: {exc})"
        ) from exc


def as_float_array(x, name: str) -> np.ndarray:
    """Return ``x`` as an ndarray of float16, float32 or float64 in native byte order.

    Array-likes (lists, scalars) are converted with ``np.asarray``; an ndarray of
    the right dtype comes back as it is, uncopied. A float array stored in the
    other byte order (``'>f4'`` on a little-endian machine) is copied to the
    native order: the same values, so results are identical. Anything else is a
    TypeError naming the argument: other dtypes (ints, bool, complex, object,
    float128), values NumPy cannot convert, and masked arrays.
    """
    arr = x if type(x) is np.ndarray else _asarray(x, name)  # the common case, fast
    if arr.dtype in FLOAT_DTYPES:
        return arr
    native = arr.dtype.newbyteorder("=")
    if arr.dtype.kind == "f" and native in FLOAT_DTYPES:
        return arr.astype(native)  # a copy in native byte order, values unchanged
    raise TypeError(f"{name} has dtype {arr.dtype}; expected float16, float32 or float64")


def check_flag(value, name: str) -> bool:
    """A yes/no argument (``causal``, ``return_lse``): a Python bool or a NumPy bool.

    Nothing else: ``causal="False"`` (a string from a config file) is truthy,
    and ``None`` or ``0`` usually mean an argument was forgotten or misplaced.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


CAUSAL_SPELLINGS = "False, True, 'top_left' or 'bottom_right'"


def check_causal(causal, name: str = "causal") -> str | None:
    """The one spelling of the causal mask, taken by every attention function here and on the
    GPU: ``None`` for ``False`` (no mask), ``"top_left"`` for ``True`` or ``"top_left"``
    (query ``i`` sees keys ``j <= i``, as SDPA's ``is_causal=True``), ``"bottom_right"`` for
    ``"bottom_right"`` (query ``i`` sees keys ``j <= i + Nk - Nq``: the queries are the last
    ``Nq`` positions of the sequence, as in FlashAttention 2.1 and later, and in decoding
    from a cache). The two agree when ``Nq == Nk``. Bools may be NumPy's; any other value
    (``1``, ``None``, the string ``"True"``) is an error naming the argument.
    """
    if isinstance(causal, (bool, np.bool_)):
        return "top_left" if causal else None
    if isinstance(causal, str):
        if causal in ("top_left", "bottom_right"):
            return causal
        raise ValueError(f"{name} must be {CAUSAL_SPELLINGS}, got {causal!r}")
    raise TypeError(f"{name} must be {CAUSAL_SPELLINGS}, got {type(causal).__name__}")


def causal_top_left(causal, Nq: int, Nk: int, where: str, name: str = "causal") -> bool:
    """Whether a function that masks top-left only (``where`` names it) masks: ``check_causal``,
    with ``"bottom_right"`` taken where it is the same mask (``Nq == Nk``) and refused, naming
    the functions that align it, where it is not."""
    kind = check_causal(causal, name)
    if kind == "bottom_right" and Nq != Nk:
        raise ValueError(
            f"{name}='bottom_right' (query i sees keys j <= i + Nk - Nq) differs from the "
            f"top-left mask when Nq != Nk (here Nq = {Nq}, Nk = {Nk}), and the mask of {where} "
            f"is top-left (query i sees keys j <= i, {name}=True); bottom-right masks "
            "are computed by paged_attention and flashref.gpu.decode_attention / "
            "paged_decode_attention"
        )
    return kind is not None


def causal_bottom_right(causal, where: str, name: str = "causal") -> bool:
    """Whether a function that masks bottom-right only (new queries against a cache; ``where``
    names it) masks: ``check_causal``, with top-left (``True``) refused, since it would hide
    most of the cache from the new queries."""
    kind = check_causal(causal, name)
    if kind == "top_left":
        raise ValueError(
            f"{name}={causal!r} is the top-left mask (query i sees keys j <= i), which would "
            f"hide most of the cache from the new queries, and the mask of {where} is "
            f"bottom-right: pass {name}='bottom_right' (query i sees keys j <= i + Nk - Nq) "
            f"or {name}=False"
        )
    return kind is not None


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


def check_block(size, name: str, minimum: int = 1, maximum: int | None = None) -> int:
    """A tile or block size, a count or an index: an int (NumPy ints too, not a bool) of at
    least ``minimum`` and, where ``maximum`` is given, at most ``maximum``."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(size).__name__}")
    if size < minimum or (maximum is not None and size > maximum):
        span = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be {span}, got {size}")
    return int(size)


def check_sdpa_call(query, key, attn_mask, dropout_p, is_causal, enable_gqa) -> None:
    """``F.scaled_dot_product_attention``'s arguments as ``flashref.torch.attention`` takes
    them: those flashref does not implement (a mask, dropout) are errors naming them; a
    float may be a NumPy float and a bool a NumPy bool, as everywhere in flashref."""
    if attn_mask is not None:
        raise NotImplementedError(
            "attn_mask is not supported by flashref.torch.attention (its kernels mask only "
            "causally: use is_causal=True, or F.scaled_dot_product_attention for a mask)"
        )
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p} is not supported by flashref.torch.attention (no dropout "
            "in its kernels); use dropout_p=0.0"
        )
    enable_gqa = check_flag(enable_gqa, "enable_gqa")
    check_flag(is_causal, "is_causal")  # SDPA's bool: top-left (flashref's "top_left")
    if hasattr(query, "shape") and hasattr(key, "shape") and query.ndim >= 3 and key.ndim >= 3:
        if query.shape[-3] != key.shape[-3] and not enable_gqa:
            raise ValueError(
                f"query has {query.shape[-3]} heads and key {key.shape[-3]}; grouped heads need "
                "enable_gqa=True (as in F.scaled_dot_product_attention)"
            )


def check_scale(scale, d: int, dtype) -> float:
    """The score scale in ``S = scale * Q K^T``: one rule for the NumPy functions and the GPU.

    ``None`` means ``1/sqrt(d)``. Otherwise ``scale`` must be a real number (a
    Python int or float, a NumPy scalar, a Fraction; not a bool) that is
    finite, nonzero, and still finite and nonzero once rounded to ``dtype``,
    the accumulation dtype (float32 for float16/float32 inputs and on the GPU,
    float64 for float64 inputs). Each refusal is a ValueError naming ``scale``:

    - inf or NaN would make every score inf or NaN;
    - a value beyond the dtype's range (``1e300`` in float32, or an int too
      large for any float) would round to inf, and a tiny one (``1e-50`` in
      float32) to 0;
    - zero makes every score 0 and every weight uniform whatever ``q`` is,
      which is almost always a slip (``scale=1 // 8``).

    A negative scale is allowed: ``softmax(-c Q K^T)`` is well defined (it
    favours the least similar keys), PyTorch's ``scaled_dot_product_attention``
    takes it, and the GPU kernels support it. Returns a Python float.
    """
    dtype = np.dtype(dtype)
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    try:
        value = float(scale)
        if math.isinf(value) and scale != value:  # np.longdouble(1e4000) becomes inf
            raise OverflowError
    except OverflowError:
        raise ValueError(
            f"scale ({type(scale).__name__}) is too large to convert to a float; expected a "
            f"finite number with |scale| <= {np.finfo(dtype).max:.4g} ({dtype})"
        ) from None
    if not math.isfinite(value) or value == 0.0:
        raise ValueError(f"scale must be finite and nonzero, got {value}")
    with np.errstate(over="ignore", under="ignore"):
        rounded = dtype.type(value)
    if not np.isfinite(rounded) or rounded == 0:
        info = np.finfo(dtype)
        raise ValueError(
            f"scale {value:g} becomes {float(rounded)} in {dtype}, the accumulation dtype "
            f"here; expected {info.smallest_subnormal:.4g} <= |scale| <= {info.max:.4g}"
        )
    return value


def group_size(Hq: int, Hkv: int, context: str = "", kv: str = "k") -> int:
    """``G = Hq // Hkv``: how many query heads share each K/V head (grouped-query attention).

    ``Hq == Hkv`` (G = 1) is ordinary multi-head attention, ``Hkv == 1`` multi-query
    attention. Anything but a positive multiple is a ValueError naming ``kv``, the holder
    of the K/V heads; ``context`` (the shapes, say) is appended to its message.
    """
    if Hq == Hkv:
        return 1
    if Hkv < 1 or Hq < 1 or Hq % Hkv:
        raise ValueError(
            f"q has {Hq} heads but {kv} has {Hkv}: the query heads must be a multiple of the "
            f"K/V heads (query head h uses K/V head h // (Hq // Hkv)){context}"
        )
    return Hq // Hkv


def check_shapes(q, k, v) -> int:
    """The shape rules of attention, for any arrays with a ``.shape`` (NumPy or CuPy).

    q (..., Hq, Nq, d), k (..., Hkv, Nk, d), v (..., Hkv, Nk, dv), d >= 1, no
    broadcasting. k and v have identical leading dims; q's equal theirs except on the
    head axis (-3), where ``Hq`` may be a multiple of ``Hkv`` (grouped-query attention,
    as ``scaled_dot_product_attention(enable_gqa=True)``). Returns that multiple,
    ``G = Hq // Hkv`` (1 when the heads are equal, and for 2-D inputs (N, d), which have
    no head axis). Each refusal is a ValueError naming the shapes.
    """
    for name, arr in (("q", q), ("k", k), ("v", v)):
        if arr.ndim < 2:
            raise ValueError(
                f"{name} has shape {arr.shape}; expected at least 2 dimensions (..., N, d)"
            )
    shapes = f"q {q.shape}, k {k.shape}, v {v.shape}"
    if not (q.ndim == k.ndim == v.ndim):
        hint = ""
        if min(q.ndim, k.ndim, v.ndim) == 2:
            hint = (
                "; a 2-D array (N, d) has no head axis, so grouped K/V heads need at "
                "least 3 dimensions in all three: (..., H, N, d)"
            )
        raise ValueError(f"q, k and v must have the same rank; got {shapes}{hint}")
    if k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"leading (batch/head) dimensions must be equal in k and v: {shapes}")
    G = 1
    if q.ndim >= 3:
        if q.shape[:-3] != k.shape[:-3]:
            raise ValueError(
                f"leading (batch) dimensions before the head axis (-3) must be equal: {shapes}"
            )
        G = group_size(q.shape[-3], k.shape[-3], f"; got {shapes}")
    if q.shape[-1] < 1:
        raise ValueError(f"q has shape {q.shape}; the head dim d must be >= 1")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k has shape {k.shape} but q has head dim {q.shape[-1]}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"v has shape {v.shape} but k has {k.shape[-2]} keys; v must be (..., Nk, dv)"
        )
    return G


def check_qkv(q, k, v):
    """Validate attention inputs; return them as arrays, the output dtype and the group size.

    Float16/32/64 arrays with the shapes of ``check_shapes``; ``G = Hq // Hkv``.
    """
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    G = check_shapes(q, k, v)
    out_dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    return q, k, v, out_dtype, G


def check_mask(mask, q: np.ndarray, k: np.ndarray):
    """A boolean mask broadcastable to (..., Nq, Nk); True means "may attend"."""
    if mask is None:
        return None
    mask = _asarray(mask, "mask")
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
