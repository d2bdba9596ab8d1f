"""Two more times of one call beside the event time: the host's, and the kernels' alone.

CUDA events around a call time from the first event to the last on the GPU; a short call's
kernels start only after the host has built their launch, so that time holds the host's work
too. These two split it:

- ``host_us``: the median over ``calls`` of ``time.perf_counter`` around one call, the device
  synchronised after each (outside the timed part), so every call starts on an idle GPU.
  It is what the caller's thread spends in the call: checks, launches, allocations.
- ``kernel_us``: the GPU time of the call's kernels, from ``torch.profiler``'s CUDA activity
  (CUPTI, which sees CuPy's kernels as well as torch's): the sum of the kernel durations over
  ``calls`` calls, divided by ``calls``. Copies and memsets are not kernels and are left out.
"""

from __future__ import annotations

import statistics
import time

NOT_KERNELS = ("Memcpy", "Memset")  # the names CUPTI gives copies and memsets


def host_us(run, synchronize, calls: int = 20) -> float:
    """Median microseconds of host time of one ``run()``; ``synchronize()`` after each."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
        synchronize()
    return statistics.median(times) * 1e6


def kernel_sum_us(events, device_type) -> float | None:
    """Microseconds of the kernels among profiler ``events`` (those of ``device_type``), or
    None if there is none (a profiler that saw nothing is not a call of 0 us)."""
    kernels = [
        e.time_range.elapsed_us()
        for e in events
        if e.device_type == device_type and not e.name.startswith(NOT_KERNELS)
    ]
    return sum(kernels) if kernels else None


def kernel_us(torch, run, calls: int = 5) -> float | None:
    """Microseconds of GPU kernel time per ``run()``, over ``calls`` profiled calls."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    total = kernel_sum_us(prof.events(), torch.autograd.DeviceType.CUDA)
    return None if total is None else total / calls
