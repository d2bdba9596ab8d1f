"""Running softmax statistics: the state that makes streaming exact.

After seeing some of a row's scores, everything the softmax still needs about
them fits in three numbers per row (names from the FlashAttention paper):

- ``m``: the largest score seen so far;
- ``l``: the sum of ``exp(score - m)`` over the scores seen so far;
- ``o``: for attention, the unnormalised output ``sum(exp(score - m) * value)``
  (a vector of length ``dv`` per row); ``None`` when only the softmax is wanted.

``l`` and ``o`` are always expressed on the scale of the current ``m``. When a
larger maximum arrives, the old sums are multiplied by the correction factor
``exp(m_old - m_new)`` so that every term ends up on one common scale; the
final answer is ``o / l`` and the log-sum-exp is ``m + log(l)``.

``SoftmaxState.update`` folds one new block of scores into a state (the loop
body of the online softmax and of FlashAttention). ``merge_states`` combines
two partial states computed independently, for example over two halves of the
keys; merging is exact, commutative, and associative up to rounding, which is
why the order and grouping of tiles do not matter (split-KV decoding relies on
this).

A row that has seen no scores, or only ``-inf`` (fully masked) scores, has
``m = -inf`` and ``l = 0``. Its result is zeros and ``lse = -inf``, produced
without NaN and without warnings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import FLOAT_DTYPES, as_float_array, check_block


def shift_of(m: np.ndarray) -> np.ndarray:
    """The shift to subtract: ``m`` itself, except 0 where ``m = -inf``.

    With nothing seen yet (``m = -inf``), ``x - m`` would be ``-inf - -inf = NaN``.
    Shifting by 0 instead gives ``exp(-inf) = 0``: an empty row contributes nothing.
    """
    return np.where(np.isneginf(m), 0.0, m).astype(m.dtype)


@dataclass(frozen=True)
class SoftmaxState:
    """Running statistics of a streaming softmax over the last axis.

    Attributes (``...`` are any leading dims, one row per index):
        m: ``(...)`` running maximum.
        l: ``(...)`` running sum of ``exp(s - m)``.
        o: ``(..., dv)`` running unnormalised output ``sum(exp(s - m) v)``, or None.
    """

    m: np.ndarray  # (...)
    l: np.ndarray  # (...)
    o: np.ndarray | None = None  # (..., dv)

    def __post_init__(self):
        """Check the fields once, at construction: float arrays, one row shape for m and l.

        Array-likes are converted (as every function here converts its inputs);
        arrays of a float dtype are kept as they are, uncopied.
        """
        m, l = as_float_array(self.m, "m"), as_float_array(self.l, "l")  # (...)
        o = None if self.o is None else as_float_array(self.o, "o")  # (..., dv)
        if l.shape != m.shape:
            raise ValueError(f"l has shape {l.shape} but m has {m.shape}; expected one shape")
        if o is not None and (o.ndim == 0 or o.shape[:-1] != m.shape):
            raise ValueError(f"o has shape {o.shape}; expected m's shape {m.shape} + (dv,)")
        if m is not self.m or l is not self.l or o is not self.o:  # converted: store the arrays
            object.__setattr__(self, "m", m)  # (the dataclass is frozen)
            object.__setattr__(self, "l", l)
            object.__setattr__(self, "o", o)

    @classmethod
    def empty(cls, shape, dv: int | None = None, dtype=np.float64) -> SoftmaxState:
        """The state before any score is seen: ``m = -inf``, ``l = 0``, ``o = 0``.

        ``shape`` is the row shape, ``dv`` the output width (None: no ``o``),
        ``dtype`` float16, float32 or float64.
        """
        shape = tuple(shape)
        if dv is not None:
            dv = check_block(dv, "dv", minimum=0)
        if np.dtype(dtype) not in FLOAT_DTYPES:
            raise TypeError(f"dtype is {np.dtype(dtype)}; expected float16, float32 or float64")
        m = np.full(shape, -np.inf, dtype=dtype)
        l = np.zeros(shape, dtype=dtype)
        o = None if dv is None else np.zeros(shape + (dv,), dtype=dtype)
        return cls(m, l, o)

    @classmethod
    def from_scores(cls, s, v=None) -> SoftmaxState:
        """The state of one block on its own; shapes of ``s`` and ``v`` as in ``update``."""
        s = as_float_array(s, "s")
        v = None if v is None else as_float_array(v, "v")
        dv = None if v is None else v.shape[-1]
        return cls.empty(s.shape[:-1], dv, s.dtype).update(s, v)

    def update(self, s, v=None) -> SoftmaxState:
        """Fold in one block of scores ``s (..., Br, Bc)`` (and values ``v (..., Bc, dv)``).

        ``s`` has one row of ``Bc`` scores per row of the state. The ``Br`` rows
        of a tile share one block of values, as the queries of a tile share its
        keys and values, so the new output is the matrix product ``P @ V``: for
        one query (a state with no row axes) ``s`` is ``(Bc,)`` and ``v (Bc, dv)``.

        The rule of the online softmax: take the new maximum, rescale the old
        sums by ``exp(m_old - m_new)``, add the new block's exponentials on the
        new scale. Masked scores are ``-inf`` and contribute exactly zero.
        """
        s = as_float_array(s, "s")  # arrays pass through uncopied: this is the inner loop
        v = None if v is None else as_float_array(v, "v")
        if (v is None) != (self.o is None):
            raise ValueError("v must be given exactly when the state tracks an output o")
        if s.ndim == 0 or s.shape[:-1] != self.m.shape:
            raise ValueError(f"s has shape {s.shape}; expected {self.m.shape} + (Bc,)")
        if v is not None and v.shape != s.shape[:-2] + s.shape[-1:] + self.o.shape[-1:]:
            raise ValueError(
                f"v has shape {v.shape}; expected {s.shape[:-2] + s.shape[-1:] + self.o.shape[-1:]}"
                f" (..., Bc, dv) for s {s.shape}: the rows of s share one block of values"
            )
        m_new = np.maximum(self.m, s.max(axis=-1, initial=-np.inf))  # (...)
        shift = shift_of(m_new)
        alpha = np.exp(self.m - shift)  # (...) correction factor, <= 1
        p = s - shift[..., None]  # (..., Bc): a new array, so the exp can work in place
        np.exp(p, out=p)  # unnormalised weights
        l_new = self.l * alpha + p.sum(axis=-1)
        o_new = None if v is None else self.o * alpha[..., None] + p @ v  # (..., dv)
        return SoftmaxState(m_new, l_new, o_new)

    def lse(self) -> np.ndarray:
        """Natural log-sum-exp of everything seen: ``m + log(l)``, ``-inf`` for empty rows."""
        out = np.full(self.l.shape, -np.inf, dtype=self.l.dtype)
        np.log(self.l, out=out, where=self.l != 0)  # l = 0 only for empty rows; NaN stays NaN
        return out + shift_of(self.m)

    def result(self) -> np.ndarray:
        """The normalised output ``o / l`` (``(..., dv)``); zeros for empty rows."""
        if self.o is None:
            raise ValueError("this state tracks no output o; use lse() instead")
        l = self.l[..., None]
        # l = 0 only for rows that saw nothing; a NaN l (NaN input) must propagate, not become 0
        return np.divide(self.o, l, out=np.zeros_like(self.o), where=l != 0)

    @classmethod
    def from_output(cls, o, lse) -> SoftmaxState:
        """The state of a finished attention result ``O (..., dv)``, ``lse (...)``, ready to merge.

        A normalised output has thrown away ``m`` and ``l``, but ``lse = m + log(l)`` keeps
        all that a merge needs: ``m = lse``, ``l = 1``, ``o = O`` describes the same scores
        (``o / l = O`` and ``m + log(l) = lse``). Rows with ``lse = -inf`` saw no key and
        become the empty state (``m = -inf``, ``l = 0``, ``o = 0``). This is how a result
        computed elsewhere (another device in ring attention, another split of the keys
        in split-KV decoding) joins ``merge_states``. The state is in the common dtype of
        ``o`` and ``lse``.
        """
        o = as_float_array(o, "o")
        lse = as_float_array(lse, "lse")
        if o.ndim < 1 or o.shape[:-1] != lse.shape:
            raise ValueError(
                f"o has shape {o.shape} and lse {lse.shape}; expected o (..., dv) and lse (...)"
            )
        dtype = np.result_type(o.dtype, lse.dtype)
        empty = np.isneginf(lse)  # (...) rows that saw no key
        l = np.where(empty, 0, 1).astype(dtype)  # (...)
        o = np.where(empty[..., None], 0, o).astype(dtype)  # (..., dv)
        return cls(lse.astype(dtype), l, o)


def merge_states(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """Combine two partial states over disjoint sets of scores, exactly.

    Both are brought to the common maximum ``m = max(a.m, b.m)``:
    ``l = a.l * exp(a.m - m) + b.l * exp(b.m - m)`` and likewise for ``o``.
    The result does not depend on the order of ``a`` and ``b``, and merging
    is associative up to floating-point rounding.

    Returns:
        A new ``SoftmaxState``, the state of the scores of ``a`` and ``b`` together.
    """
    for name, state in (("a", a), ("b", b)):
        if not isinstance(state, SoftmaxState):
            raise TypeError(f"{name} must be a SoftmaxState, got {type(state).__name__}")
    if (a.o is None) != (b.o is None):
        raise ValueError("cannot merge a state that tracks an output o with one that does not")
    if a.m.shape != b.m.shape:
        raise ValueError(f"states have different row shapes: a {a.m.shape}, b {b.m.shape}")
    if a.o is not None and a.o.shape != b.o.shape:
        raise ValueError(
            f"states have outputs of different widths dv: a.o {a.o.shape}, b.o {b.o.shape}"
        )
    m = np.maximum(a.m, b.m)
    shift = shift_of(m)
    alpha_a = np.exp(a.m - shift)
    alpha_b = np.exp(b.m - shift)
    l = a.l * alpha_a + b.l * alpha_b
    o = None if a.o is None else a.o * alpha_a[..., None] + b.o * alpha_b[..., None]
    return SoftmaxState(m, l, o)


def streaming_weighted_sum(scores, values, tile_size: int) -> float:
    """Softmax-weighted sum of scalar ``values`` for one query, streamed in tiles.

    ``scores`` and ``values`` are 1-D of equal length N. Computes
    ``sum(softmax(scores) * values)`` visiting ``tile_size`` scores at a time and
    keeping only the running state (m, l, o) between tiles, so scores like
    ``1000 + log(i)`` never overflow. Returns a Python float (float64 arithmetic).
    """
    scores = as_float_array(scores, "scores")
    values = as_float_array(values, "values")
    tile_size = check_block(tile_size, "tile_size")
    if scores.ndim != 1 or values.shape != scores.shape:
        raise ValueError(
            f"scores and values must be 1-D of equal length; got scores {scores.shape}, "
            f"values {values.shape}"
        )
    scores = scores.astype(np.float64)
    values = values.astype(np.float64)[:, None]  # (N, 1): scalar values as 1-vectors
    state = SoftmaxState.empty((), dv=1)
    for start in range(0, len(scores), tile_size):
        tile = slice(start, start + tile_size)
        state = state.update(scores[tile], values[tile])
    return float(state.result()[0])
