"""GPU buffers reused from call to call, one per (device, stream, size class).

Two parts of a decode call need a buffer that nothing outside the call reads afterwards:
version 4's and 5's arrival counters (``flashref.gpu.decode.counters``) and the split
partials (``flashref.gpu.decode.workspace``). Allocating them anew costs more host time than
a short kernel runs, so one buffer is kept per (device, stream, size class) in a dict the
caller owns: calls on one stream run one after another, so they can share a buffer; calls
on two streams could run at once, so they do not. The size class is the length rounded up to
a power of two (at least the caller's minimum), so a few buffers serve every shape. ``held``
wraps a launch: if the launch raises, the buffer is dropped (its state is unknown, a kernel
may still use it) and the next call makes a fresh one.
"""

from __future__ import annotations

from contextlib import contextmanager


def size_class(n: int, minimum: int, what: str) -> int:
    """The buffer length that holds ``n`` elements: a power of two, at least ``minimum``;
    ``what`` names the elements in the error for a bad ``n``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int ({what}), got {n!r}")
    return max(minimum, 1 << (n - 1).bit_length())


def _key(cp, length: int):
    return cp.cuda.Device().id, cp.cuda.get_current_stream().ptr, length


def buffer(store: dict, cp, length: int, make):
    """``store``'s buffer of ``length`` for the current device and stream; ``make(length)``
    makes it the first time."""
    key = _key(cp, length)
    buf = store.get(key)
    if buf is None:
        buf = store[key] = make(length)
    return buf


@contextmanager
def held(store: dict, cp, length: int, make):
    """``with held(store, cp, length, make) as buf: launch(...)``; on an exception the buffer
    is dropped from ``store``."""
    key = _key(cp, length)
    buf = buffer(store, cp, length, make)
    try:
        yield buf
    except BaseException:
        store.pop(key, None)
        raise
