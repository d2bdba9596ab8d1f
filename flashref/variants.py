"""Attention variants: changes to the scores, changes to the mask, and the tiles a mask skips.

The attention models use is the softmax of chapter 4 with one of two kinds of change:

- **to the score** ``s = scale * q . k`` of a pair, before the softmax: ``softcap`` (Gemma 2:
  ``c * tanh(s / c)``, which bounds every score in ``(-c, c)``), ``alibi_slopes`` (ALiBi: each
  head ``h`` adds ``-slope[h] * |i + Nk - Nq - j|``, a penalty growing with the distance from
  the query to the key) and a user ``score_mod``;
- **to the mask**, which pairs may attend: ``window=(left, right)`` (sliding-window attention,
  Mistral and Gemma: query ``i`` sees keys ``i + Nk - Nq - left <= j <= i + Nk - Nq + right``,
  FlashAttention's ``window_size``, ``-1`` for no bound on that side) and a user ``mask_mod``;

plus one change to the softmax's denominator: ``sinks`` (gpt-oss), one learnable logit per
head that joins every row's sum, ``l = sum_j exp(s_j) + exp(sink)``, and carries no value.
A row may then put weight on "nothing": its outputs shrink when no key stands out.

The user functions have FlexAttention's meaning (``torch.nn.attention.flex_attention``):
``score_mod(score, b, h, q_idx, kv_idx)`` returns the new score and ``mask_mod(b, h, q_idx,
kv_idx)`` whether the pair may attend. Here they are NumPy-vectorised: each call gets a whole
tile, ``score`` (..., Hq, Br, Bc) and integer index arrays that broadcast against it (``b``
the flat index of the batch dims before the head axis, 0 where there are none; ``h`` the
query head; ``q_idx (Br, 1)`` and ``kv_idx (1, Bc)`` the positions, counted from 0 in q and
in k). The backward of a user ``score_mod`` needs its derivative ``score_mod_grad(score, b, h,
q_idx, kv_idx)``, d(new score)/d(score) at ``score``; it is an argument, never guessed.

The order, in every function that takes them: the scaled score, then ``softcap``, then the
ALiBi bias, then ``score_mod``; then the mask (``causal``, ``mask``, ``window``, ``mask_mod``:
a pair attends only if all of them allow it); then the softmax, with the sink in its
denominator. ``lse`` is the log of that whole denominator, the sink's term included.

**The block mask.** A tiled loop asks each (query tile, key tile) once what kind it is:
``EMPTY`` (no pair may attend: the tile is skipped, no product computed), ``FULL`` (every pair
may: computed without a mask) or ``PARTIAL`` (masked pair by pair). ``block_mask`` gives the
whole table, as FlexAttention's ``create_block_mask`` does; its count of visited tiles is
the work a window saves.

``Variants`` binds the arguments of one call to its shapes (``Variants.of`` checks them all,
before any work). With no variant it changes nothing: the scores, the mask and the first
softmax state are exactly those of the plain function.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._checks import as_float_array, check_block, check_causal
from .state import SoftmaxState

__all__ = ["EMPTY", "FULL", "PARTIAL", "Variants", "block_mask"]

NAMES = ("window", "softcap", "alibi_slopes", "sinks", "score_mod", "mask_mod")  # keywords
BACKWARD_NAMES = NAMES + ("score_mod_grad",)  # the backward's take the derivative too

EMPTY, PARTIAL, FULL = 0, 1, 2  # the kinds of a (query tile, key tile) in a block mask


def _check_window(window, causal: str | None, Nq: int, Nk: int, where: str):
    """``(left, right)`` with ``-1`` for no bound, or None (no window).

    The window sits on FlashAttention's diagonal ``j = i + Nk - Nq``. A top-left causal mask
    (``causal=True``) is on ``j = i``: the two differ when ``Nq != Nk``, and are refused.
    """
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a pair (left, right), got {window!r}")
    for side, n in zip(("left", "right"), window, strict=True):
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
            raise TypeError(f"window's {side} bound must be an int, got {type(n).__name__}")
        if n < -1:
            raise ValueError(f"window's {side} bound must be >= 0, or -1 for none; got {n}")
    left, right = int(window[0]), int(window[1])
    if causal == "top_left" and Nq != Nk and (left, right) != (-1, -1):
        raise ValueError(
            f"window is aligned on the diagonal j = i + Nk - Nq (as FlashAttention's "
            f"window_size) and causal=True on j = i; here Nq = {Nq}, Nk = {Nk}, so the two "
            f"differ: {where} takes a window with causal only when Nq == Nk"
        )
    return None if (left, right) == (-1, -1) else (left, right)


def _check_softcap(softcap):
    """A positive finite cap, or None; 0 means none (FlashAttention's default ``softcap=0.0``)."""
    if softcap is None:
        return None
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a real number or None, got {type(softcap).__name__}")
    value = float(softcap)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"softcap must be finite and > 0 (0 or None: no cap), got {value}")
    return value or None


def _check_per_head(x, name: str, heads: tuple, allow_neg_inf: bool):
    """A float array of one value per query head: shape ``heads`` (``(Hq,)``, or ``()`` for 2-D
    inputs), every value finite (``-inf`` allowed for a sink: no sink)."""
    if x is None:
        return None
    x = as_float_array(x, name)
    if x.shape != heads:
        raise ValueError(f"{name} has shape {x.shape}; expected {heads}, one value per query head")
    bad = np.isnan(x) | np.isposinf(x) | (np.isneginf(x) & (not allow_neg_inf))
    if bad.any():
        also = " (or -inf: no sink)" if allow_neg_inf else ""
        raise ValueError(f"{name} holds {x[bad].ravel()[0]}; expected finite values{also}")
    return x


def _check_callable(f, name: str):
    if f is not None and not callable(f):
        raise TypeError(f"{name} must be a function or None, got {type(f).__name__}")
    return f


class Variants:
    """The variants of one call, bound to its shapes: what a tile loop asks of them.

    Made by ``Variants.of``. With no variant given, every method returns what the plain
    function would use (the same arrays, no arithmetic).
    """

    def __init__(self, shape_q, Nk, G, dtype, causal, window, softcap, alibi, sinks, mods):
        self.batch, self.Nq, self.Nk, self.G = shape_q[:-2], shape_q[-2], Nk, G
        self.dtype, self.causal, self.window, self.softcap = dtype, causal, window, softcap
        self.alibi, self.sinks = alibi, sinks
        self.score_mod, self.score_mod_grad, self.mask_mod = mods
        self._memo = (None, None, None)  # the last tile's own mask (_own_mask)
        n = len(shape_q)
        if n == 2:  # (N, d): no head axis, no batch
            self.b, self.h = np.zeros((), np.int64), np.zeros((), np.int64)
        else:
            self.h = np.arange(shape_q[-3]).reshape(-1, 1, 1)  # (Hq, 1, 1)
            outer = shape_q[:-3]
            flat = np.arange(math.prod(outer), dtype=np.int64)
            self.b = flat.reshape(outer + (1, 1, 1))  # (..., 1, 1, 1), 0 for 3-D inputs

    @classmethod
    def of(cls, q, k, G, dtype, causal, where, variants: dict, backward: bool = False):
        """Check every variant keyword of a call (``variants``, the function's ``**variants``)
        with inputs ``q``, ``k`` (already checked), accumulating in ``dtype``; ``where`` names
        the function in errors. ``backward`` takes ``score_mod_grad`` too, and needs it
        wherever there is a ``score_mod``."""
        names = BACKWARD_NAMES if backward else NAMES
        unknown = sorted(set(variants) - set(names))
        if unknown:
            raise TypeError(
                f"{where}() got an unexpected keyword argument {unknown[0]!r}; its variants "
                f"are {', '.join(names)}"
            )
        window, softcap, alibi_slopes, sinks, score_mod, mask_mod, score_mod_grad = (
            variants.get(name) for name in BACKWARD_NAMES
        )
        kind = check_causal(causal)
        Nq, Nk = q.shape[-2], k.shape[-2]
        heads = q.shape[-3:-2]  # (Hq,), or () for 2-D inputs
        mods = (
            _check_callable(score_mod, "score_mod"),
            _check_callable(score_mod_grad, "score_mod_grad"),
            _check_callable(mask_mod, "mask_mod"),
        )
        if score_mod_grad is not None and score_mod is None:
            raise ValueError(
                "score_mod_grad was given without the score_mod it is the derivative of"
            )
        if backward and score_mod is not None and score_mod_grad is None:
            raise ValueError(
                f"{where} needs score_mod_grad, the derivative of score_mod with respect to the "
                "score (score_mod_grad(score, b, h, q_idx, kv_idx)), to take the gradient "
                "through score_mod"
            )
        slopes = _check_per_head(alibi_slopes, "alibi_slopes", heads, allow_neg_inf=False)
        sinks = _check_per_head(sinks, "sinks", heads, allow_neg_inf=True)
        return cls(
            q.shape,
            Nk,
            G,
            dtype,
            kind,
            _check_window(window, kind, Nq, Nk, where),
            _check_softcap(softcap),
            slopes,
            sinks,
            mods,
        )

    # -- the pieces of a tile ------------------------------------------------------------
    def _unpacked(self, S):
        """A packed score tile (..., Hkv, G * Br, Bc) as (..., Hq, Br, Bc) (a view)."""
        return S.reshape(self.batch + (S.shape[-2] // self.G, S.shape[-1]))

    def _packed(self, x):
        """A tile (..., Hq, Br, Bc) packed as ``attention.pack_heads`` packs the rows."""
        if self.G == 1:
            return x
        Hkv, GBr = self.batch[-1] // self.G, self.G * x.shape[-2]
        return x.reshape(self.batch[:-1] + (Hkv, GBr, x.shape[-1]))

    def _result(self, x, name, tile_shape, kind):
        """The output of a user function, checked: it must broadcast to the tile."""
        x = np.asarray(x)
        if kind == "bool" and x.dtype != np.bool_:
            raise TypeError(f"{name} returned dtype {x.dtype}; expected bool (True = may attend)")
        if kind == "float" and x.dtype.kind not in "fiu":
            raise TypeError(f"{name} returned dtype {x.dtype}; expected real numbers")
        try:
            return np.broadcast_to(x, tile_shape)
        except ValueError:
            raise ValueError(
                f"{name} returned shape {x.shape}, which does not broadcast to the tile "
                f"{tile_shape} (..., Hq, Br, Bc)"
            ) from None

    def _indices(self, rows: range, cols: range):
        q_idx = np.arange(rows.start, rows.stop).reshape(-1, 1)  # (Br, 1)
        kv_idx = np.arange(cols.start, cols.stop).reshape(1, -1)  # (1, Bc)
        return self.b, self.h, q_idx, kv_idx

    def scores(self, S, rows: range, cols: range, grad: bool = False):
        """The tile's scores after ``softcap``, ALiBi and ``score_mod`` (packed as ``S`` came).

        With ``grad``, returns ``(S_new, dS_new/dS)``; the derivative is None where the scores
        were not changed by a function of themselves (none given, or only ALiBi's bias).
        """
        g = None
        if self.softcap is None and self.alibi is None and self.score_mod is None:
            return (S, g) if grad else S
        packed = S.shape
        S = self._unpacked(S)  # (..., Hq, Br, Bc)
        if self.softcap is not None:
            c = self.dtype.type(self.softcap)
            S = c * np.tanh(S / c)
            g = 1 - (S / c) ** 2  # d(c tanh(s / c))/ds = 1 - tanh(s / c)^2
        b, h, q_idx, kv_idx = self._indices(rows, cols)
        if self.alibi is not None:
            slopes = self.alibi.astype(self.dtype)[..., None, None]  # (Hq, 1, 1)
            S = S - slopes * np.abs(q_idx + (self.Nk - self.Nq) - kv_idx)  # (..., Hq, Br, Bc)
        if self.score_mod is not None:
            before = S
            S = self._result(
                self.score_mod(before, b, h, q_idx, kv_idx), "score_mod", S.shape, "float"
            ).astype(self.dtype)
            if grad:
                d = self.score_mod_grad(before, b, h, q_idx, kv_idx)
                d = self._result(d, "score_mod_grad", S.shape, "float").astype(self.dtype)
                g = d if g is None else g * d
        S = S.reshape(packed)
        if not grad:
            return S
        return S, None if g is None else g.reshape(packed)

    def _window_bounds(self, rows: range):
        """The first and last key each row may see under the window (and causal's edge)."""
        i = np.arange(rows.start, rows.stop) + (self.Nk - self.Nq)  # the diagonal j = i + Nk - Nq
        left, right = self.window
        lo = i - left if left >= 0 else np.full_like(i, -1)
        hi = i + right if right >= 0 else np.full_like(i, self.Nk)
        return lo, hi

    def allowed(self, allowed, rows: range, cols: range):
        """``allowed`` (the tile's pairs under ``causal`` and ``mask``, packed, or None for
        all) narrowed by the window and ``mask_mod``; None still means every pair."""
        if self.window is None and self.mask_mod is None:
            return allowed
        more = self._own_mask(rows, cols)
        if more is None:
            return allowed
        more = self._packed(more)  # (..., Hkv, G * Br, Bc)
        return more if allowed is None else allowed & more

    def _own_mask(self, rows: range, cols: range):
        """The window's and ``mask_mod``'s pairs of one tile, (..., Hq, Br, Bc) unpacked, or
        None when they allow every pair. The last tile's answer is kept: a loop asks
        ``skips`` and then ``allowed`` of the same tile."""
        if self._memo[:2] == (rows, cols):
            return self._memo[2]
        mask = None
        if self.window is not None:
            lo, hi = self._window_bounds(rows)
            j = np.arange(cols.start, cols.stop)
            mask = (j >= lo[:, None]) & (j <= hi[:, None])  # (Br, Bc)
        if self.mask_mod is not None:
            b, h, q_idx, kv_idx = self._indices(rows, cols)
            tile = self.batch + (len(rows), len(cols))
            mod = self._result(self.mask_mod(b, h, q_idx, kv_idx), "mask_mod", tile, "bool")
            mask = mod if mask is None else mask & mod
        if mask is not None:
            mask = None if mask.all() else np.broadcast_to(mask, self.batch + mask.shape[-2:])
        self._memo = (rows, cols, mask)
        return mask

    def _causal_shift(self):
        """Causal's edge ``j <= i + shift``: 0 top-left, ``Nk - Nq`` bottom-right; None: none."""
        if self.causal is None:
            return None
        return self.Nk - self.Nq if self.causal == "bottom_right" else 0

    def tile_kind(self, rows: range, cols: range) -> int:
        """``EMPTY``, ``PARTIAL`` or ``FULL``: what ``causal``, the window and ``mask_mod`` leave
        of this (query tile, key tile), over every batch and head."""
        j0, j1 = cols.start, cols.stop - 1
        shift = self._causal_shift()
        if shift is not None and j0 > rows.stop - 1 + shift:
            return EMPTY  # every key after every query's edge
        if self.window is not None:
            lo, hi = self._window_bounds(rows)
            if j1 < lo[0] or j0 > hi[-1]:  # both bounds grow with the row
                return EMPTY
        allowed = None
        if shift is not None and j1 > rows.start + shift:  # the tile straddles the edge
            allowed = np.arange(j0, j1 + 1) <= np.arange(rows.start, rows.stop)[:, None] + shift
        own = self._own_mask(rows, cols)
        if own is not None:
            allowed = own if allowed is None else allowed & own
        if allowed is None or allowed.all():
            return FULL
        return PARTIAL if allowed.any() else EMPTY

    def skips(self, rows: range, cols: range) -> bool:
        """Whether the window or ``mask_mod`` leaves no pair of this tile: a tiled loop skips
        it. (``causal``'s empty tiles the loops skip by their bounds, as in chapter 4.)"""
        if self.window is None and self.mask_mod is None:
            return False
        return self.tile_kind(rows, cols) == EMPTY

    def block_mask(self, block_q: int, block_k: int) -> np.ndarray:
        """The kind of every (query tile, key tile), (Tr, Tc): ``tile_kind`` for each."""
        rows = [range(r, min(r + block_q, self.Nq)) for r in range(0, self.Nq, block_q)]
        cols = [range(c, min(c + block_k, self.Nk)) for c in range(0, self.Nk, block_k)]
        kinds = np.empty((len(rows), len(cols)), dtype=np.int8)
        for a, r in enumerate(rows):
            for c_, c in enumerate(cols):
                kinds[a, c_] = self.tile_kind(r, c)
        return kinds

    # -- the sink ------------------------------------------------------------------------
    def first_state(self, shape, dv: int, rows: range) -> SoftmaxState:
        """The softmax state a query tile starts from (``shape`` its packed rows).

        No sink: the empty state (``m = -inf``, ``l = 0``, ``o = 0``). A sink is one more
        score in every row's denominator, with a value of zero: the state of having seen it,
        ``m = sink``, ``l = 1``, ``o = 0``, which is ``SoftmaxState.from_output`` of a zero
        output with ``lse = sink``. The statistics of chapter 3 gain nothing new.
        """
        if self.sinks is None:
            return SoftmaxState.empty(shape, dv, self.dtype)
        per_row = np.broadcast_to(
            self.sinks.astype(self.dtype)[..., None], self.batch + (len(rows),)
        )
        lse = per_row.reshape(shape)  # (..., Hkv, G * Br), packed as the rows
        return SoftmaxState.from_output(np.zeros(shape + (dv,), self.dtype), lse)

    def sink_grad(self, L, D):
        """d(loss)/d(sinks): ``-sum over rows of exp(sink - lse) * D``, per head.

        ``L`` (..., Hq, Nq, 1), or packed as a tile's rows, is lse made ready for ``exp``
        (``-inf`` as ``+inf``), ``D`` the rows' ``rowsum(dO * O)``. The sink is a score whose
        value is zero, so its ``dP`` is 0 and its ``dS = P_sink * (0 - D)``.
        """
        if self.sinks is None:
            return None
        rows = self.batch + (self.Nq, 1)
        L, D = L.reshape(rows), D.reshape(rows)  # (..., Hq, Nq, 1), unpacked
        P_sink = np.exp(self.sinks.astype(self.dtype)[..., None, None] - L)  # (..., Hq, Nq, 1)
        per_head = -(P_sink * D).sum(axis=(-2, -1))  # (..., Hq)
        per_head = per_head.reshape((-1,) + self.sinks.shape).sum(axis=0)
        return per_head.astype(self.sinks.dtype)


def block_mask(Nq, Nk, block_q, block_k, *, causal=False, window=None, mask_mod=None, heads=1):
    """The block mask of a (Nq, Nk) attention cut into ``block_q`` x ``block_k`` tiles.

    Returns an int8 array (Tr, Tc) of ``EMPTY`` (0), ``PARTIAL`` (1) or ``FULL`` (2), over
    ``heads`` query heads (``mask_mod`` sees ``h`` in ``range(heads)`` and ``b = 0``): a tile
    is EMPTY only if no pair of any head may attend, FULL only if every pair of every head may.
    ``(kinds != EMPTY).sum()`` is the number of tiles a tiled loop visits.
    """
    Nq, Nk = check_block(Nq, "Nq", minimum=0), check_block(Nk, "Nk", minimum=0)
    block_q, block_k = check_block(block_q, "block_q"), check_block(block_k, "block_k")
    heads = check_block(heads, "heads")
    q = np.empty((heads, Nq, 0))
    k = np.empty((heads, Nk, 0))
    v = Variants.of(
        q,
        k,
        1,
        np.dtype(np.float64),
        causal,
        "block_mask",
        {"window": window, "mask_mod": mask_mod},
    )
    return v.block_mask(block_q, block_k)
