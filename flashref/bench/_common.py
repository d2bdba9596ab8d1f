"""What the benchmarks share: the shapes, the timing of one config (``median_ms``, the one
timing median of events), the SM clock sampler, torch's SDPA when it is there, and the
writing of a results file (``write_result``)."""

from __future__ import annotations

import json
import statistics
import threading
from pathlib import Path

HEADS = 16
REPEATS = 10  # calls per timing; each round's number is their median


def batch(N: int) -> int:
    return max(1, 2 * 16384 // N)


def flops(B: int, N: int, d: int, causal: bool) -> float:
    f = 4.0 * B * HEADS * N * N * d
    return f / 2 if causal else f


def median_ms(run, make_event, repeats: int, warmup: int) -> float:
    """Median over ``repeats`` of one call, timed by device events around it."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start, end = make_event(), make_event()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append((start, end))
    return statistics.median(elapsed_ms(s, e) for s, e in times)


def write_result(result, path) -> None:
    """``result`` as indented JSON at ``path`` (its folders made), ending in a newline: how
    every program writes what it measured (``flashref.recorded.files.read_json`` reads it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def elapsed_ms(start, end) -> float:
    if hasattr(start, "elapsed_time"):  # torch.cuda.Event
        return start.elapsed_time(end)
    import cupy as cp

    return cp.cuda.get_elapsed_time(start, end)


class ClockSampler:
    """Samples the SM clock through NVML every 0.2 s while it runs (None without NVML), keeping
    the samples taken while the GPU was busy: more than ``min_util`` percent of the last
    sample period with a kernel running (50 by default; a host-bound run, such as a small
    model's training step, keeps its GPU busy less than half of the time and asks for less)."""

    def __init__(self, min_util: int = 50):
        if isinstance(min_util, bool) or not isinstance(min_util, int) or not 0 <= min_util < 100:
            raise ValueError(f"min_util must be an int percent in [0, 100), got {min_util!r}")
        self.min_util = min_util
        self.samples: list[int] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            self._nvml = None

    def __enter__(self):
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.2):
            clock = self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM)
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            if util > self.min_util:  # only while kernels run
                self.samples.append(int(clock))

    def __exit__(self, *exc):
        self._stop.set()

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        s = sorted(self.samples)
        out = {"median_mhz": s[len(s) // 2], "min_mhz": s[0], "max_mhz": s[-1], "samples": len(s)}
        return out if self.min_util == 50 else out | {"min_util_pct": self.min_util}


def import_torch():
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception:
        return None, None, None
    if not torch.cuda.is_available():
        return None, None, None
    return torch, SDPBackend, sdpa_kernel
