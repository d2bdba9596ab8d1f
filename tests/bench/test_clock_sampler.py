"""``ClockSampler``'s arguments and summary, without a GPU (its NVML thread needs one)."""

from __future__ import annotations

import pytest

from flashref.bench._common import ClockSampler


@pytest.mark.parametrize("bad", [-1, 100, 50.0, True, "50"])
def test_min_util_is_a_percent(bad):
    with pytest.raises(ValueError, match="min_util must be an int percent"):
        ClockSampler(min_util=bad)


def test_the_summary_says_a_threshold_other_than_the_default():
    busy, any_kernel = ClockSampler(), ClockSampler(min_util=5)
    assert busy.summary() is None  # nothing sampled (no NVML here, or not entered)
    for sampler in (busy, any_kernel):
        sampler.samples = [1980, 1755, 1965]
    want = {"median_mhz": 1965, "min_mhz": 1755, "max_mhz": 1980, "samples": 3}
    assert busy.summary() == want
    assert any_kernel.summary() == want | {"min_util_pct": 5}
