"""The two timelines chapter 12 draws, and the source pieces it prints, checked on the CPU.

``overlap_timeline`` is a schematic of versions 20 and 21 with made-up durations: the
tests check the order it claims (version 21 runs P_{j-1} V_{j-1} while the softmax of
tile j is computed, never two products at once, and finishes sooner), not a speed.
``ring_boxes`` comes from the pingpong model's order of events: a stage holds one tile at a
time and is refilled only after both warpgroups released the tile before.
"""

from __future__ import annotations

import pytest

from flashref.gpu import listing
from flashref.gpu.forward_versions import kernel_diff
from flashref.hardware import hopper_figures as hf


def _lane(boxes, lane):
    return sorted((b for b in boxes if b[0] == lane), key=lambda b: b[1])


@pytest.mark.parametrize("n_tiles", [1, 2, 5])
@pytest.mark.parametrize("overlap", [False, True])
def test_a_lane_never_does_two_things_at_once(n_tiles, overlap):
    boxes = hf.overlap_timeline(n_tiles, overlap=overlap)
    for lane in ("tensor", "warps"):
        mine = _lane(boxes, lane)
        assert all(a[2] <= b[1] + 1e-12 for a, b in zip(mine, mine[1:], strict=False))
    assert sum(b[3].startswith("softmax") for b in boxes) == n_tiles
    assert sum(b[3].startswith("PV") for b in boxes) == n_tiles


def test_version_21_overlaps_the_product_with_the_next_softmax_and_ends_sooner():
    v20 = hf.overlap_timeline(4, overlap=False)
    v21 = hf.overlap_timeline(4, overlap=True)
    assert max(b[2] for b in v21) < max(b[2] for b in v20)
    for j in range(1, 4):
        pv = next(b for b in v21 if b[3] == f"PV{j - 1}")
        sm = next(b for b in v21 if b[3] == f"softmax {j}")
        assert pv[1] < sm[2] and sm[1] < pv[2]  # they overlap in time
    for j in range(4):  # version 20: P V of a tile only after its softmax
        pv = next(b for b in v20 if b[3] == f"PV{j}")
        sm = next(b for b in v20 if b[3] == f"softmax {j}")
        assert pv[1] >= sm[2]


def test_overlap_timeline_refuses_a_duration_that_is_not_positive():
    with pytest.raises(ValueError, match="t_softmax must be a positive number"):
        hf.overlap_timeline(3, t_softmax=0)


@pytest.mark.parametrize("n_tiles, stages", [(6, 3), (5, 2), (2, 3)])
def test_a_stage_holds_one_tile_at_a_time_and_tiles_go_round(n_tiles, stages):
    boxes = hf.ring_boxes(n_tiles, stages)
    held = [b for b in boxes if b[0].startswith("stage")]
    assert sorted(int(b[3].split()[1]) for b in held) == list(range(n_tiles))
    for b in held:
        assert b[0] == f"stage {int(b[3].split()[1]) % stages}"
    for s in range(stages):
        mine = _lane(held, f"stage {s}")
        assert all(a[2] < b[1] for a, b in zip(mine, mine[1:], strict=False))


def test_the_figures_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for fig in (hf.draw_overlap(), hf.draw_ring()):
        assert fig.get_size_inches()[0] == hf.WIDTH_IN
        plt.close(fig)


def test_section_is_the_header_text_between_two_headings():
    text = listing.section("common/hopper_common.cuh", "wgmma: issue")
    assert text.startswith("// ---- wgmma: issue, commit, wait")
    assert "wgmma.wait_group.sync.aligned" in text and "wgmma_fence_acc" in text
    assert "wgmma.mma_async" not in text  # the next section's
    with pytest.raises(ValueError, match="no section 'nothing'"):
        listing.section("common/hopper_common.cuh", "nothing")


def test_function_is_one_definition_with_its_comment():
    text = listing.function("hopper/v19_wgmma.cu", "qk")
    lines = text.splitlines()
    assert lines[0].startswith("// S (64 x Bc)") and lines[-1] == "}"
    assert "wgmma_wait<0>();" in text and "void pv(" not in text


def test_hunks_keeps_the_hunks_with_a_word_and_counts_the_rest():
    diff = kernel_diff(20, 21)
    total = diff.count("\n@@")
    some = listing.hunks(diff, "wgmma_wait<1>")
    assert some.splitlines()[:2] == diff.splitlines()[:2]
    assert "wgmma_wait<1>" in some
    shown = some.count("\n@@")
    assert 0 < shown < total
    assert some.endswith(f"{total - shown} more of the {total} hunks in the full diff")
    assert listing.hunks(diff, "@@", "-", "+", " ").count("\n@@") == total
