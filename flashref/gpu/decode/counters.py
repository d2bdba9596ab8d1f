"""The arrival counters of decode version 4: one per row block, zero between calls.

Version 4's split kernel (``flashref/kernels/decode/v04_last_block_merge.cu``) counts each finished
split block of a row block ``(b, blockIdx.y)`` on a ``uint32`` in global memory; the block
that brings the count to ``S`` merges the row block's partials and sets the counter back to
0. So the buffer must be all zeros before every launch, and it is after every launch that ran.

One zeroed buffer is kept per (device, stream, size class): calls on one stream run one
after another, so they can share counters; calls on two streams could run at once, so they
do not. The size class is the count rounded up to a power of two (at least ``MIN_COUNTERS``),
so a few buffers serve every shape. ``counting`` wraps a launch: if the launch raises, the
buffer is dropped (its state is unknown) and the next call allocates a fresh zeroed one.
"""

from __future__ import annotations

from contextlib import contextmanager

from . import stream_buffers

MIN_COUNTERS = 1024  # 4 KiB: every row block count up to this shares one buffer

_buffers: dict = {}


def size_class(n: int) -> int:
    """The buffer length that holds ``n`` counters: a power of two, at least MIN_COUNTERS."""
    return stream_buffers.size_class(n, MIN_COUNTERS, "row blocks to count")


def _zeros(cp):
    return lambda length: cp.zeros(length, dtype=cp.uint32)


def counter_buffer(cp, n: int):
    """The zeroed ``uint32`` buffer of at least ``n`` counters for the current device and stream."""
    return stream_buffers.buffer(_buffers, cp, size_class(n), _zeros(cp))


@contextmanager
def counting(cp, n: int):
    """``with counting(cp, n) as counters: launch(...)``; on an exception the buffer is dropped."""
    with stream_buffers.held(_buffers, cp, size_class(n), _zeros(cp)) as buf:
        yield buf
