"""Argument checks kept per call signature, exactly: what a decode step repeats every call.

A decode loop calls ``decode_attention`` with the same shapes, dtypes and options token after
token; the checks of those (``flashref.gpu.decode.checks``) are pure functions of them and cost
more host time than a short kernel runs. ``CheckMemo`` runs a check once per *signature*: for
each array its type, ``ndim``, ``shape`` and ``dtype`` (all that the shape and dtype checks
read), for each scalar argument its type and value (so ``False`` and ``0``, ``1`` and
``True``, ``2`` and ``2.0`` are different signatures: their checks differ). Only a check that
returned is kept; one that raised is not, so bad input raises every time with its message. A
signature that cannot be built or hashed (an object without a shape, a list as an option) is
not kept either: the check runs and says what is wrong. Values read from arrays (``lengths``,
a block table) are not part of a signature: their checks run on every call.

At most ``kept`` signatures are held; the oldest goes first.
"""

from __future__ import annotations

MAX_KEPT = 256
_MISS = object()


def signature(arrays, scalars):
    """The hashable key of a call, or None where one cannot be built (the check then runs)."""
    try:
        key = (
            tuple((type(x), x.ndim, tuple(x.shape), x.dtype) for x in arrays),
            tuple((type(s), s) for s in scalars),
        )
        hash(key)
    except Exception:  # no shape or dtype, an unhashable option: not kept
        return None
    return key


class CheckMemo:
    """``memo(arrays, scalars)`` returns ``check(*arrays, *scalars)``, run once per signature."""

    def __init__(self, check, kept: int = MAX_KEPT):
        self.check, self.kept, self.outcomes = check, kept, {}

    def __call__(self, arrays: tuple, scalars: tuple):
        key = signature(arrays, scalars)
        if key is not None:
            hit = self.outcomes.get(key, _MISS)
            if hit is not _MISS:
                return hit
        outcome = self.check(*arrays, *scalars)  # raises on bad input: nothing is kept
        if key is not None:
            if len(self.outcomes) >= self.kept:
                self.outcomes.pop(next(iter(self.outcomes)))  # the oldest
            self.outcomes[key] = outcome
        return outcome

    def clear(self) -> None:
        self.outcomes.clear()
