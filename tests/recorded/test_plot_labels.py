"""flashref.recorded.labels: labels that keep their order and never overlap, as close as they
can."""

from __future__ import annotations

import numpy as np
import pytest

from flashref.recorded.labels import label_columns, spread


def test_labels_far_apart_stay_where_they_are():
    assert spread([0.0, 1.0, 2.5], 0.5).tolist() == [0.0, 1.0, 2.5]


def test_crowded_labels_fan_out_around_their_points():
    out = spread([1.0, 1.0, 1.0], 0.1)
    assert np.allclose(out, [0.9, 1.0, 1.1])  # centred on the points, not piled above
    out = spread([0.0, 0.05, 0.06, 2.0], 0.1)
    assert (np.diff(out) >= 0.1 - 1e-12).all() and out[-1] == 2.0


@pytest.mark.parametrize("seed", range(5))
def test_the_gap_holds_and_no_order_is_lost(seed):
    values = np.sort(np.random.default_rng(seed).uniform(0, 3, 18))
    out = spread(values, 0.12)
    assert (np.diff(out) >= 0.12 - 1e-9).all()
    # least squares: the mean shift is zero in every block of labels moved together
    assert abs((out - values).sum()) < 1e-9


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="sorted"):
        spread([2.0, 1.0], 0.1)
    with pytest.raises(ValueError, match="gap must be"):
        spread([1.0], -1)


def test_label_columns_keep_each_columns_order():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set(xscale="log", yscale="log")
    points = [(2000.0, 200 + i, f"v{i}") for i in range(10)] + [(1000.0, 7.5, "v1")]
    texts = label_columns(ax, points)
    assert sorted(t.get_text() for t in texts) == sorted(p[2] for p in points)
    for c in (0, 1):
        col = [t for t in texts if t.xyann[0] == 2000.0 * 2.2 * (c + 1)]
        ys = [t.xyann[1] for t in col]
        assert ys == sorted(ys)
        logs = np.log10(ys)
        assert (np.diff(logs) >= 0.11 - 1e-9).all()
    plt.close(fig)
