"""The staging-store model (``flashref.hardware.staging_stores``), on the CPU.

Its address formula and lane order are checked against the lines of the kernels it
restates, its wavefront count against a brute force over banks, and its store count
against the registry's tiles. No GPU needed.
"""

from __future__ import annotations

import numpy as np
import pytest

from flashref.gpu.backward_versions import BWD_VERSIONS, code_lines
from flashref.hardware import staging_stores as ss


def brute_wavefronts(offsets, nbytes=8):
    """One half-warp at a time: a pass takes at most one word per bank, every word once."""
    total = 0
    for half in (offsets[:16], offsets[16:]):
        pending = {a // 4 + i for a in half for i in range(nbytes // 4)}
        passes = 0
        while pending:
            taken = {}
            for w in sorted(pending):
                taken.setdefault(w % 32, w)
            pending -= set(taken.values())
            passes += 1
        total += passes
    return total


def test_the_kernels_restated():
    for number in ss.VERSIONS:
        code = " ".join(" ".join(code_lines(number)).split())
        assert "(((c % 32) >> 2) ^ (r & 7)) << 4" in code  # the swizzled chunk
        assert "st_shared_f2(dQs + dq_stage_addr(" in code
        reordered = "const int m = swap ? n ^ 2 : n;" in code
        assert reordered == (number in (18, 19)), number
        assert ("const bool swap = t >= 2;" in code) == reordered
        rows_split = "DQR * cw + 16 * warp + g + 8 * h" in code
        assert rows_split == (number in (17, 19)), number
        assert (BWD_VERSIONS[number].Br == 128) == rows_split


def test_stage_offset_is_a_permutation_of_each_box():
    rows, cols = np.meshgrid(np.arange(64), np.arange(0, 128, 2), indexing="ij")
    off = ss.stage_offset(rows, cols)
    assert len(np.unique(off)) == off.size  # no two elements share 8 bytes
    assert off.min() == 0 and off.max() == 4 * 64 * 128 - 8  # four boxes at d = 128
    assert np.all(off // 128 % 64 == rows)  # each row stays within its 128 bytes of a box


@pytest.mark.parametrize("version", ss.VERSIONS)
def test_each_lane_stores_each_of_its_values_once(version):
    d = 64
    count = ss.groups(version, d)
    for w in range(4):
        for cw in (0, 1):
            seen = np.stack(
                [ss.store_offsets(version, d, n, h, w, cw) for n in range(count) for h in (0, 1)]
            )
            assert len(np.unique(seen)) == seen.size  # (lanes x groups) distinct places
            if version in (18, 19):  # the same places as the version before, reordered
                base = version - 2
                ref = np.stack(
                    [ss.store_offsets(base, d, n, h, w, cw) for n in range(count) for h in (0, 1)]
                )
                assert np.array_equal(np.sort(seen, axis=0), np.sort(ref, axis=0))


@pytest.mark.parametrize("version", ss.VERSIONS)
def test_wavefronts_match_a_brute_force(version):
    for d in (64,) if version in (17, 19) else (64, 128):
        for n in range(ss.groups(version, d)):
            off = ss.store_offsets(version, d, n, 1, 3, 1)
            assert ss.wavefronts(off) == brute_wavefronts(list(off))
        expected = 2 if version in (18, 19) else 4
        assert ss.wavefronts_per_store(version, d) == {expected}


def test_counts():
    # version 16 at (8, 16, 4096), d = 128: 4096 blocks x 64 tiles x 8 warps x 16 stores
    assert ss.stores(16, 128, 8, 16, 4096) == 4096 * 64 * 8 * 16
    assert ss.extra_wavefronts(16, 128, 8, 16, 4096) == 2 * 4096 * 64 * 8 * 16
    assert ss.stores(17, 64, 8, 16, 4096) == 4096 * 32 * 8 * 16
    assert ss.extra_wavefronts(18, 128, 8, 16, 4096) == 0
    assert ss.stores(16, 64, 1, 1, 100) == 1 * 2 * 8 * 8  # one block, two ragged tiles


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="version"):
        ss.groups(15, 64)
    with pytest.raises(ValueError, match="d must"):
        ss.groups(17, 128)
    with pytest.raises(ValueError, match="n, h, warp, cw"):
        ss.store_offsets(16, 64, 4, 0)
    with pytest.raises(ValueError, match="offsets"):
        ss.wavefronts(np.zeros(16))
