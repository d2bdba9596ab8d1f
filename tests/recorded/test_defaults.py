"""flashref.recorded.defaults: the rule that picks a family's default version (made-up runs)."""

from __future__ import annotations

import pytest

from flashref.recorded.defaults import best_worst_case, worst_cases


def test_the_default_is_the_best_worst_case_not_the_best_median():
    # version 2 wins by 0.03% at two lengths and loses 8% at the third: the median would pick
    # it; the worst case picks version 1, never more than 1% behind
    tflops = {
        1: {1024: 100.0, 4096: 200.0, 16384: 300.0},
        2: {1024: 92.0, 4096: 200.06, 16384: 300.09},
        3: {1024: 99.0, 4096: 198.0, 16384: 297.0},
    }
    cases = worst_cases(tflops)
    assert cases[1] == (200.0 / 200.06, 200.0) and cases[2] == (0.92, 200.06)
    assert best_worst_case(tflops) == 1
    # equal worst cases: the higher median, then the lower number
    assert best_worst_case({4: {1: 1.0, 2: 3.0}, 5: {1: 1.0, 2: 3.0}, 6: {1: 1.0, 2: 2.0}}) == 4
    assert best_worst_case({7: {1: 5.0}}) == 7


def test_the_default_rule_refuses_versions_measured_at_other_lengths():
    with pytest.raises(ValueError, match="same lengths N"):
        best_worst_case({1: {1024: 1.0}, 2: {4096: 1.0}})
    with pytest.raises(ValueError, match="at least one version"):
        best_worst_case({})
