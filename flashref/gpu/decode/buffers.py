"""The GPU buffers a decode call reuses from call to call: the split partials and the
arrival counters.

Two parts of a decode call need memory that nothing outside the call reads afterwards:

* **Partials.** With ``S > 1`` splits the split kernel writes, per packed row, ``S`` partial
  outputs ``O_part (rows, S, d)`` and their ``lse_part (rows, S)`` in float32; the combine
  kernel (or the last split block, versions 4 and 5) reads them back into ``O`` and ``lse``.
* **Counters.** Version 4's and 5's split kernels count each finished split block of a row
  block ``(b, blockIdx.y)`` on a ``uint32``; the block that brings the count to ``S`` merges
  the row block's partials and sets the counter back to 0. So the counters are all zeros
  before every launch, and after every launch that ran.

Allocating them anew costs more host time than a short kernel runs, so one buffer of each
kind is kept per (device, stream, size class): calls on one stream run one after another, so
a call's kernels have finished with a buffer before the next call's kernels use it; calls on
two streams could run at once, so they do not share. The size class is the length rounded up
to a power of two (at least ``MIN_FLOATS`` partials, ``MIN_COUNTERS`` counters), so a few
buffers serve every shape. ``partials`` and ``counting`` wrap a launch: if it raises, the
buffer is dropped (its state is unknown, a kernel may still use it) and the next call makes a
fresh one. ``O`` and ``lse`` are never taken from here: the caller keeps them. A plan
(``flashref.gpu.decode.plan``) and a torch call allocate their own instead.
"""

from __future__ import annotations

from contextlib import contextmanager

MIN_FLOATS = 1 << 16  # 256 KiB: every small call shares one buffer of partials
MIN_COUNTERS = 1024  # 4 KiB: every row block count up to this shares one buffer

_partials: dict = {}  # (device, stream, length) -> float32 buffer
_counters: dict = {}  # (device, stream, length) -> zeroed uint32 buffer


def size_class(n: int, minimum: int = MIN_FLOATS, what: str = "floats of partials") -> int:
    """The buffer length that holds ``n`` elements: a power of two, at least ``minimum``;
    ``what`` names the elements in the error for a bad ``n``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int ({what}), got {n!r}")
    return max(minimum, 1 << (n - 1).bit_length())


def _key(cp, length: int):
    return cp.cuda.Device().id, cp.cuda.get_current_stream().ptr, length


def _buffer(store: dict, cp, length: int, make):
    """``store``'s buffer of ``length`` for the current device and stream; ``make(length)``
    makes it the first time."""
    key = _key(cp, length)
    buf = store.get(key)
    if buf is None:
        buf = store[key] = make(length)
    return buf


@contextmanager
def _held(store: dict, cp, length: int, make):
    """``with _held(store, cp, length, make) as buf: launch(...)``; on an exception the buffer
    is dropped from ``store``."""
    key = _key(cp, length)
    buf = _buffer(store, cp, length, make)
    try:
        yield buf
    except BaseException:
        store.pop(key, None)
        raise


def _empty(cp):
    return lambda length: cp.empty(length, dtype=cp.float32)


def _zeros(cp):
    return lambda length: cp.zeros(length, dtype=cp.uint32)


def views(buf, rows: int, S: int, d: int):
    """``O_part (rows, S, d)`` then ``lse_part (rows, S)``, C-contiguous views of ``buf``.

    ``O_part`` starts the buffer; ``lse_part`` follows it at ``rows * S * d`` floats, a
    multiple of 256 bytes for d in (64, 128), so both keep the buffer's alignment."""
    n = rows * S * d
    return buf[:n].reshape(rows, S, d), buf[n : n + rows * S].reshape(rows, S)


@contextmanager
def partials(cp, rows: int, S: int, d: int):
    """``with partials(cp, rows, S, d) as (O_part, lse_part): launch(...)``; on an exception
    the buffer is dropped."""
    n = rows * S * (d + 1)
    with _held(_partials, cp, size_class(n), _empty(cp)) as buf:
        yield views(buf, rows, S, d)


def counter_size_class(n: int) -> int:
    """The buffer length that holds ``n`` counters: a power of two, at least MIN_COUNTERS."""
    return size_class(n, MIN_COUNTERS, "row blocks to count")


def counter_buffer(cp, n: int):
    """The zeroed ``uint32`` buffer of at least ``n`` counters for the current device and
    stream."""
    return _buffer(_counters, cp, counter_size_class(n), _zeros(cp))


@contextmanager
def counting(cp, n: int):
    """``with counting(cp, n) as counters: launch(...)``; on an exception the buffer is
    dropped."""
    with _held(_counters, cp, counter_size_class(n), _zeros(cp)) as buf:
        yield buf
