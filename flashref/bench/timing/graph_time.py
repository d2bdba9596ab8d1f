"""The GPU time of one call as a decode loop runs it: calls captured in a CUDA graph, replayed.

A serving loop does not launch a decode step's kernels one Python call at a time: it
captures the step in a CUDA graph once and replays it every token, so the host's work
(checks, launches, allocations) is gone from the step and the kernels of one call follow
those of the previous call with only the graph's own gaps between them. This module times
that way, the same for every implementation:

- the inputs rotate among ``sets`` copies, enough that together they are at least
  ``L2_MULTIPLE`` times the L2 cache, so a call reads its K and V from HBM as a decode step
  of a real model (another layer's cache in between) does, not from the L2;
- one graph holds ``calls`` calls (a whole number of passes over the sets), captured on a
  side stream after a warm-up there (both torch and CuPy run on that stream: flashref keeps
  its per-stream buffers for it), in relaxed capture mode (CuPy's pool may allocate an
  output during the capture), every output of the capture kept alive with the graph;
- ``replay_us``: device events around one replay, divided by ``calls``.
"""

from __future__ import annotations

import math
import statistics
import warnings

L2_MULTIPLE = 3  # the rotated inputs together: at least this many times the L2
MAX_SETS = 8
MIN_GRAPH_BYTES = 8e9  # K/V bytes one replay reads at least (about 2 ms at 4 TB/s) ...
MIN_CALLS, MAX_CALLS = 2, 64  # ... within these call counts


def input_sets(kv_bytes: int, l2_bytes: int) -> int:
    """Copies of the inputs to rotate among: together at least ``L2_MULTIPLE`` x the L2."""
    if kv_bytes <= 0:
        raise ValueError(f"kv_bytes must be positive, got {kv_bytes}")
    return max(1, min(MAX_SETS, math.ceil(L2_MULTIPLE * l2_bytes / kv_bytes)))


def graph_calls(kv_bytes: int, sets: int) -> int:
    """Calls in one graph: enough to read ``MIN_GRAPH_BYTES`` (within the call limits),
    rounded up to a whole number of passes over the ``sets``."""
    calls = max(MIN_CALLS, min(MAX_CALLS, math.ceil(MIN_GRAPH_BYTES / kv_bytes)))
    return sets * math.ceil(calls / sets)


class CapturedCalls:
    """``calls`` zero-argument callables captured, in order, in one CUDA graph (torch's)."""

    def __init__(self, torch, cp, calls):
        self.torch, self.calls = torch, len(calls)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), _cupy_view(cp, stream):
            for call in calls:  # warm-up on the capture stream: compiled, buffers made
                call()
        stream.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with _cupy_view(cp, stream):
            with torch.cuda.graph(self.graph, stream=stream, capture_error_mode="relaxed"):
                self.outputs = [call() for call in calls]  # kept: the graph writes them
        torch.cuda.synchronize()

    def replay_us(self, replays: int) -> float:
        """Median over ``replays`` of the event time of one replay, per call, in us."""
        torch = self.torch
        self.graph.replay()  # the first replay uploads the graph
        torch.cuda.synchronize()
        times = []
        for _ in range(replays):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            self.graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / self.calls)
        return statistics.median(times)

    def last_output(self):
        """What the last captured call returned (after a replay: its values)."""
        return self.outputs[-1]


def _cupy_view(cp, stream):
    """CuPy's handle on torch's ``stream``, to make it CuPy's current stream too
    (``ExternalStream``, which CuPy 14 marks deprecated but still provides)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(stream.cuda_stream)
