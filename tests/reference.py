"""Independent float64 references (the oracles) and NaN-safe comparisons.

Nothing here imports flashref's implementations: each reference is written
straight from the formula, row by row, in float64, with sums taken by
``math.fsum`` (exactly rounded), so that its own error is far below that of
anything it is used to judge.

``attention_backward_ref`` gives the gradients of attention through the
softmax's Jacobian, row by row, independently of the library's formula.

Also here: the "same-precision naive" attention, forward and backward, the
textbook formula computed entirely in one dtype (float32 or float16).
Following FlashAttention's own tests, a kernel's error against the float64
reference is judged relative to the error this naive computation makes on the
same inputs.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np

from flashref._blas_flags import MESSAGE as STRAY_MATMUL_FLAG


def softmax_ref(x, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis`` in float64: ``exp(x - max) / fsum(exp(x - max))`` per row.

    Rows must hold finite values (the test inputs do); returns float64.
    """
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)  # (..., N)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        if row.size == 0:
            continue
        e = np.exp(row - row.max())
        out[idx] = e / math.fsum(e)
    return np.moveaxis(out, -1, axis)


def weighted_sum_ref(scores, values) -> float:
    """``sum(softmax(scores) * values)`` for 1-D scores and scalar values, in float64."""
    s = np.asarray(scores, dtype=np.float64)
    w = np.exp(s - s.max())
    return math.fsum(w * np.asarray(values, dtype=np.float64)) / math.fsum(w)


def allowed_pairs(Nq: int, Nk: int, causal: bool, mask, batch: tuple) -> np.ndarray:
    """Boolean (..., Nq, Nk): which query i may attend to which key j.

    Causal is aligned top-left (PyTorch SDPA ``is_causal=True``): query ``i``
    sees key ``j`` exactly when ``j <= i``, whatever Nq and Nk are. The mask
    (True = may attend) is broadcast to the full shape; both must allow a pair.
    """
    allowed = np.ones(batch + (Nq, Nk), dtype=bool)
    if causal:
        for i in range(Nq):
            allowed[..., i, i + 1 :] = False  # query i sees keys 0..i only
    if mask is not None:
        allowed &= np.broadcast_to(np.asarray(mask, dtype=bool), allowed.shape)
    return allowed


def attention_ref(q, k, v, *, scale=None, causal=False, mask=None):
    """Attention in float64, one query row at a time: returns ``(O, lse)``.

    O (..., Nq, dv) and lse (..., Nq), both float64. A row that may attend to
    no key gets O = 0 and lse = -inf. NaN or inf in the inputs goes through
    the formula unguarded (as the textbook formula would propagate it).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    Nq, d = q.shape[-2:]
    Nk, dv = v.shape[-2:]
    batch = q.shape[:-2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    allowed = allowed_pairs(Nq, Nk, causal, mask, batch)  # (..., Nq, Nk)
    O = np.zeros(batch + (Nq, dv))
    lse = np.full(batch + (Nq,), -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):  # only NaN/inf inputs trigger these
        for b in np.ndindex(batch):
            S = scale * np.einsum("id,jd->ij", q[b], k[b])  # (Nq, Nk)
            for i in range(Nq):
                keys = np.flatnonzero(allowed[b + (i,)])
                if keys.size == 0:
                    continue
                s = S[i, keys]  # (n_allowed,)
                m = s.max()  # NaN if any score is NaN
                w = np.exp(s - m)  # (n_allowed,)
                # fsum is exact but refuses inf and NaN; those rows are NaN/inf anyway.
                l = math.fsum(w) if np.isfinite(w).all() else float(w.sum())
                O[b + (i,)] = (w @ v[b][keys]) / l
                lse[b + (i,)] = m + np.log(l)
    return O, lse


def attention_naive_lowp(q, k, v, dtype, *, scale=None, causal=False, mask=None):
    """The textbook formula (max-subtracted softmax) computed in ``dtype``: ``(O, lse)``.

    Every intermediate, including the sums, is rounded to ``dtype``: this is
    "a same-precision naive implementation", the yardstick for tolerances.
    Every row must have at least one allowed key.
    """
    dt = np.dtype(dtype)
    q, k, v = (np.asarray(a).astype(dt) for a in (q, k, v))
    Nq, d = q.shape[-2:]
    Nk = k.shape[-2]
    scale = dt.type(1.0 / math.sqrt(d) if scale is None else scale)
    S = (q * scale) @ np.swapaxes(k, -1, -2)  # (..., Nq, Nk), in dt
    allowed = allowed_pairs(Nq, Nk, causal, mask, q.shape[:-2])
    S = np.where(allowed, S, dt.type(-np.inf))
    m = S.max(axis=-1, keepdims=True)  # (..., Nq, 1)
    P = np.exp(S - m)  # (..., Nq, Nk)
    l = P.sum(axis=-1, keepdims=True, dtype=dt)  # (..., Nq, 1)
    O = ((P / l) @ v).astype(dt)  # (..., Nq, dv)
    lse = (m + np.log(l))[..., 0].astype(dt)  # (..., Nq)
    return O, lse


def attention_backward_ref(q, k, v, do, *, scale=None, causal=False, mask=None):
    """Gradients of ``sum(O * do)`` in float64 through the softmax's Jacobian, one query row
    at a time: returns ``(dq, dk, dv), (size_q, size_k, size_v)``.

    For query i with allowed keys J: ``s = scale * K_J q_i``, ``p = softmax(s)``,
    ``O_i = V_J^T p``. Back through ``O_i``: ``dv_J += outer(p, do_i)`` and
    ``dp = V_J do_i``. Back through the softmax: ``ds = Jac dp`` with the Jacobian
    ``Jac = diag(p) - outer(p, p)`` formed explicitly. Back through ``s``:
    ``dq_i = scale * K_J^T ds`` and ``dk_J += scale * outer(ds, q_i)``. A row with no
    allowed key adds nothing. Written from these formulas alone: no lse, no O, no D.

    The sizes are the same computation on absolute values, with the two terms of
    ``ds_j = p_j dp_j - p_j (p . dp)`` counted separately: the size of the terms each
    gradient entry sums. Rounding error is bounded by a
    multiple of the unit roundoff times this size (the standard error bound of a sum of
    products), not times the gradient itself, which can be small by cancellation (the
    terms of ``ds`` always sum to zero).
    """
    q, k, v, do = (np.asarray(a, dtype=np.float64) for a in (q, k, v, do))
    Nq, d = q.shape[-2:]
    Nk = k.shape[-2]
    batch = q.shape[:-2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    allowed = allowed_pairs(Nq, Nk, causal, mask, batch)  # (..., Nq, Nk)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    size_q, size_k, size_v = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in np.ndindex(batch):
        for i in range(Nq):
            keys = np.flatnonzero(allowed[b + (i,)])
            if keys.size == 0:
                continue
            K, V = k[b][keys], v[b][keys]  # (n, d), (n, dv)
            q_i, do_i = q[b + (i,)], do[b + (i,)]  # (d,), (dv,)
            s = scale * (K @ q_i)  # (n,)
            e = np.exp(s - s.max())
            p = e / math.fsum(e)  # (n,)
            jacobian = np.diag(p) - np.outer(p, p)  # (n, n): d p / d s
            ds = jacobian @ (V @ do_i)  # (n,)
            dq[b + (i,)] = scale * (K.T @ ds)
            dk[b][keys] += scale * np.outer(ds, q_i)
            dv[b][keys] += np.outer(p, do_i)
            dp_size = np.abs(V) @ np.abs(do_i)  # (n,)
            ds_size = p * dp_size + p * (p @ dp_size)  # (n,): the two terms of Jac dp
            size_q[b + (i,)] = abs(scale) * (np.abs(K).T @ ds_size)
            size_k[b][keys] += abs(scale) * np.outer(ds_size, np.abs(q_i))
            size_v[b][keys] += np.outer(p, np.abs(do_i))
    return (dq, dk, dv), (size_q, size_k, size_v)


def attention_backward_naive_lowp(q, k, v, do, dtype, *, scale=None, causal=False, mask=None):
    """The textbook backward pass with every step rounded to ``dtype``: ``(dq, dk, dv)``.

    The forward as in ``attention_naive_lowp`` (P materialised), then ``dV = P^T dO``,
    ``dP = dO V^T``, ``dS = P * (dP - rowsum(dO * O))``, ``dQ = scale dS K``,
    ``dK = scale dS^T Q``, all in ``dtype``: the yardstick for low-precision gradients.
    Every row must have at least one allowed key.
    """
    dt = np.dtype(dtype)
    q, k, v, do = (np.asarray(a).astype(dt) for a in (q, k, v, do))
    Nq, d = q.shape[-2:]
    Nk = k.shape[-2]
    scale = dt.type(1.0 / math.sqrt(d) if scale is None else scale)
    S = scale * (q @ np.swapaxes(k, -1, -2))  # (..., Nq, Nk), in dt
    S = np.where(allowed_pairs(Nq, Nk, causal, mask, q.shape[:-2]), S, dt.type(-np.inf))
    P = np.exp(S - S.max(axis=-1, keepdims=True))  # (..., Nq, Nk)
    P = P / P.sum(axis=-1, keepdims=True, dtype=dt)
    O = (P @ v).astype(dt)  # (..., Nq, dv)
    dv = np.swapaxes(P, -1, -2) @ do  # (..., Nk, dv)
    dP = do @ np.swapaxes(v, -1, -2)  # (..., Nq, Nk)
    dS = P * (dP - np.sum(do * O, axis=-1, keepdims=True, dtype=dt))  # (..., Nq, Nk)
    dq = scale * (dS @ k)  # (..., Nq, d)
    dk = scale * (np.swapaxes(dS, -1, -2) @ q)  # (..., Nk, d)
    return dq.astype(dt), dk.astype(dt), dv.astype(dt)


def softmax_lowp(x, dtype, axis: int = -1) -> np.ndarray:
    """The max-subtracted softmax with every step rounded to ``dtype`` (the yardstick)."""
    dt = np.dtype(dtype)
    x = np.asarray(x).astype(dt)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True, dtype=dt)).astype(dt)


def rel_error(actual, expected) -> float:
    """Normwise relative error ``max|actual - expected| / max|expected|`` over finite entries.

    Normwise (not elementwise) because attention outputs can be arbitrarily
    close to zero in single entries, where an elementwise ratio is meaningless.
    Returns inf if ``actual`` has a NaN or inf where ``expected`` is finite.
    """
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    finite = np.isfinite(e)
    if not np.isfinite(a[finite]).all():
        return math.inf
    if not finite.any():
        return 0.0
    scale = np.abs(e[finite]).max()
    err = np.abs(a[finite] - e[finite]).max()
    return float(err / scale) if scale > 0 else float(err)


def assert_close(actual, expected, rtol: float, what: str = "result") -> None:
    """NaN-safe comparison: same shape, NaN and +-inf in exactly the same places,
    and normwise relative error of the finite entries at most ``rtol``.

    A NaN in ``actual`` where ``expected`` has a number fails (NaN compares
    False with everything, so a plain ``err <= rtol`` on NaN would also fail,
    but here the message says where).
    """
    a = np.asarray(actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape}, expected {e.shape}"
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    assert np.array_equal(nan_a, nan_e), (
        f"{what}: NaN at {np.argwhere(nan_a != nan_e)[:5].tolist()} differs from the reference"
    )
    for sign, name in ((np.isposinf, "+inf"), (np.isneginf, "-inf")):
        assert np.array_equal(sign(a), sign(e)), f"{what}: {name} positions differ"
    err = rel_error(a, e)
    assert err <= rtol, f"{what}: relative error {err:.3e} > {rtol:.1e}"


def assert_grads_close(actual, expected, sizes, rtol: float, what: str = "gradients") -> None:
    """NaN-safe comparison of ``(dq, dk, dv)`` with the reference's, each error measured
    against the size of the terms its entries sum (``attention_backward_ref``).

    Same shapes, NaN and +-inf in exactly the same places (as ``assert_close``), and
    ``max|actual - expected| <= rtol * max(size)`` over the finite entries of each.
    """
    for name, a, e, size in zip(("dq", "dk", "dv"), actual, expected, sizes, strict=True):
        assert_close(a, e, math.inf, f"{what} {name}")  # shapes, NaN and inf positions only
        finite = np.isfinite(e)
        err = float(np.abs(np.asarray(a, dtype=np.float64)[finite] - e[finite]).max(initial=0))
        bound = rtol * float(np.asarray(size).max(initial=0))
        assert err <= bound, f"{what} {name}: error {err:.3e} > {rtol:.1e} x term size"


def expand_kv_heads_ref(x, Hq: int) -> np.ndarray:
    """K or V ``(..., Hkv, N, w)`` given to every query head: ``(..., Hq, N, w)``, float64.

    Grouped-query attention as written in its definition: query head ``h`` uses K/V head
    ``h // (Hq // Hkv)``. One head at a time, by index, so that it shares nothing with how
    the library avoids this copy. 2-D inputs (no head axis) come back as they are.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 3:
        return x.copy()
    Hkv = x.shape[-3]
    assert Hq % Hkv == 0, (Hq, Hkv)
    out = np.empty(x.shape[:-3] + (Hq,) + x.shape[-2:])
    for h in range(Hq):
        out[..., h, :, :] = x[..., h // (Hq // Hkv), :, :]
    return out


def attention_gqa_ref(q, k, v, **kw):
    """``attention_ref`` with K/V heads shared by groups of query heads: ``(O, lse)``."""
    Hq = np.shape(q)[-3] if np.ndim(q) >= 3 else 1
    return attention_ref(q, expand_kv_heads_ref(k, Hq), expand_kv_heads_ref(v, Hq), **kw)


def fold_kv_heads_ref(g, Hkv: int) -> np.ndarray:
    """A gradient per query head ``(..., Hq, N, w)`` summed onto its K/V head, ``(..., Hkv,
    N, w)``: the chain rule for a K/V head that several query heads read. One head at a time."""
    g = np.asarray(g, dtype=np.float64)
    if g.ndim < 3:
        return g.copy()
    Hq = g.shape[-3]
    out = np.zeros(g.shape[:-3] + (Hkv,) + g.shape[-2:])
    for h in range(Hq):
        out[..., h // (Hq // Hkv), :, :] += g[..., h, :, :]
    return out


def attention_backward_gqa_ref(q, k, v, do, **kw):
    """``attention_backward_ref`` with shared K/V heads: the gradients and sizes of k and v
    are those of the expanded K/V, summed over each group's query heads."""
    Hq = np.shape(q)[-3] if np.ndim(q) >= 3 else 1
    Hkv = np.shape(k)[-3] if np.ndim(k) >= 3 else 1
    (dq, dk, dv), (sq, sk, sv) = attention_backward_ref(
        q, expand_kv_heads_ref(k, Hq), expand_kv_heads_ref(v, Hq), do, **kw
    )
    fold = [fold_kv_heads_ref(x, Hkv) for x in (dk, dv, sk, sv)]
    return (dq, fold[0], fold[1]), (sq, fold[2], fold[3])


def bottom_right_pairs(Nq: int, Nk: int) -> np.ndarray:
    """Boolean (Nq, Nk) of causal attention aligned bottom-right: the ``Nq`` queries are the
    last ``Nq`` positions of a sequence of ``Nk``, so query ``i``, at position ``Nk - Nq + i``,
    sees key ``j`` exactly when ``j <= i + Nk - Nq`` (none at all when that is negative)."""
    allowed = np.zeros((Nq, Nk), dtype=bool)
    for i in range(Nq):
        for j in range(Nk):
            allowed[i, j] = j <= i + Nk - Nq
    return allowed


@contextlib.contextmanager
def no_warnings():
    """Any warning raised inside (overflow, invalid value, ...) becomes an error, except
    "invalid value encountered in matmul": some OpenBLAS kernels raise that flag on finite
    inputs, depending on the CPU (flashref/_blas_flags.py). flashref drops it from its own
    products; here it is dropped from every module, the tests' solutions and references
    included, and a real NaN is caught by the comparison of values that follows."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=STRAY_MATMUL_FLAG, category=RuntimeWarning)
        yield


def causal_refusal(bad) -> tuple[type, str]:
    """The error every function gives for ``causal=bad``, a value that is none of its
    spellings: a ValueError for a string, a TypeError for anything else, and the message."""
    got = repr(bad) if isinstance(bad, str) else type(bad).__name__
    error = ValueError if isinstance(bad, str) else TypeError
    return error, f"causal must be False, True, 'top_left' or 'bottom_right', got {got}"


def variant_attention_ref(
    q,
    k,
    v,
    *,
    causal=None,
    window=None,
    softcap=None,
    alibi=None,
    sinks=None,
    score_mod=None,
    mask_mod=None,
):
    """Attention with the variants of ``flashref.variants``, in float64, one query row at a
    time, written from their definitions: returns ``(O, lse)``.

    q (B, Hq, Nq, d), k and v (B, Hkv, Nk, .) with query head h reading K/V head
    ``h // (Hq // Hkv)``. For the pair (i, j) of batch b and head h: ``s = q . k / sqrt(d)``;
    ``s = c tanh(s / c)``; ``s -= slope[h] |i + Nk - Nq - j|``; ``s = score_mod(s, b, h, i, j)``.
    The pair attends if the causal edge (``"top_left"``: ``j <= i``; ``"bottom_right"``:
    ``j <= i + Nk - Nq``), the window (``i + Nk - Nq - left <= j <= i + Nk - Nq + right``,
    ``-1`` unbounded) and ``mask_mod(b, h, i, j)`` all allow it. ``lse = log(sum_j e^s_j +
    e^sink[h])``, ``O = sum_j e^(s_j - lse) v_j``; with neither key nor sink, O = 0 and
    lse = -inf. The user functions get Python ints and floats.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, Hq, Nq, d = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    O = np.zeros((B, Hq, Nq, v.shape[-1]))
    lse = np.full((B, Hq, Nq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            for i in range(Nq):
                terms, weights_of = [], []
                for j in range(Nk):
                    if causal == "top_left" and j > i:
                        continue
                    if causal == "bottom_right" and j > i + Nk - Nq:
                        continue
                    if window is not None:
                        left, right = window
                        if left >= 0 and j < i + Nk - Nq - left:
                            continue
                        if right >= 0 and j > i + Nk - Nq + right:
                            continue
                    if mask_mod is not None and not mask_mod(b, h, i, j):
                        continue
                    s = float(q[b, h, i] @ k[b, h // G, j]) / math.sqrt(d)
                    if softcap is not None:
                        s = softcap * math.tanh(s / softcap)
                    if alibi is not None:
                        s -= float(alibi[h]) * abs(i + Nk - Nq - j)
                    if score_mod is not None:
                        s = float(score_mod(s, b, h, i, j))
                    terms.append(s)
                    weights_of.append(j)
                if sinks is not None and sinks[h] > -np.inf:  # -inf: no sink
                    terms.append(float(sinks[h]))
                if not terms:
                    continue
                m = max(terms)
                total = math.fsum(math.exp(t - m) for t in terms)
                lse[b, h, i] = m + math.log(total)
                for s, j in zip(terms, weights_of, strict=False):  # the sink has no value
                    O[b, h, i] += math.exp(s - lse[b, h, i]) * v[b, h // G, j]
    return O, lse
