"""The partial results of a split decode call, in a workspace reused from call to call.

With ``S > 1`` splits the split kernel writes, per packed row, ``S`` partial outputs
``O_part (rows, S, d)`` and their ``lse_part (rows, S)`` in float32; the combine kernel (or
the last split block, versions 4 and 5) reads them back into ``O`` and ``lse``. Nothing
outside the call reads them afterwards, so they need not be new arrays: allocating them costs
more host time than a short kernel runs.

One float32 buffer is kept per (device, stream, size class)
(`flashref.gpu.decode.stream_buffers`), as
``flashref.gpu.decode.counters`` keeps its counters: calls on one stream run one after
another, so a call's kernels have finished with the partials before the next call's kernels
write them; calls on two streams could run at once, so they do not share. The size class is
the float count ``rows * S * (d + 1)`` rounded up to a power of two (at least
``MIN_FLOATS``). ``partials`` wraps a launch: if it raises, the buffer is dropped (a kernel
may still be using it) and the next call allocates a fresh one. ``O`` and ``lse`` are never
taken from here: the caller keeps them.
"""

from __future__ import annotations

from contextlib import contextmanager

from . import stream_buffers

MIN_FLOATS = 1 << 16  # 256 KiB: every small call shares one buffer

_buffers: dict = {}


def size_class(n: int) -> int:
    """The buffer length that holds ``n`` floats: a power of two, at least MIN_FLOATS."""
    return stream_buffers.size_class(n, MIN_FLOATS, "floats of partials")


def _empty(cp):
    return lambda length: cp.empty(length, dtype=cp.float32)


def workspace(cp, n: int):
    """The float32 buffer of at least ``n`` elements for the current device and stream."""
    return stream_buffers.buffer(_buffers, cp, size_class(n), _empty(cp))


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
    with stream_buffers.held(_buffers, cp, size_class(n), _empty(cp)) as buf:
        yield views(buf, rows, S, d)
