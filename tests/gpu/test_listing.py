"""flashref.gpu.listing: what changed from one kernel version to the next, as the chapters
print it (read from the sources; no GPU)."""

from __future__ import annotations

import pytest

from flashref.gpu import backward_versions
from flashref.gpu import listing as ls


def test_drop_renames_keeps_every_hunk_but_the_new_name():
    diff = "\n".join(
        [
            "--- v03_mma.cu",
            "+++ v04_padded.cu",
            "@@ -10,1 +10,1 @@",
            "-#define LDS D",
            "+#define LDS (D + 8)",
            "@@ -29,1 +29,1 @@",
            "-flash_v3(const half_t* Q,",
            "+flash_v4(const half_t* Q,",
            "@@ -40,1 +40,1 @@",
            "-call(flash_v3(x));",
            "+call(flash_v4(y));",
        ]
    )
    kept = ls.drop_renames(diff, 3, 4).splitlines()
    assert kept[:5] == [
        "--- v03_mma.cu",
        "+++ v04_padded.cu",
        "@@ -10,1 +10,1 @@",
        "-#define LDS D",
        "+#define LDS (D + 8)",
    ]
    assert "+flash_v4(const half_t* Q," not in kept  # the name alone: dropped
    assert "+call(flash_v4(y));" in kept  # the name and more: kept
    with pytest.raises(TypeError, match="diff is a NoneType"):
        ls.drop_renames(None, 3, 4)


def test_kernel_change_of_a_registered_version():
    text = ls.kernel_change(3, 4)
    assert "+#define LDS (D + 8)" in text
    assert "flash_v4(" not in text


def test_kernel_change_of_a_backward_version():
    text = ls.kernel_change(3, 4, "backward")
    assert "red_add_v2(" in text
    assert "flash_bwd4(" not in text  # the rename alone is left out
    assert "flash_bwd4(" in backward_versions.kernel_diff(3, 4)  # where the diff has it
    with pytest.raises(ValueError, match="family = 'sideways'"):
        ls.kernel_change(3, 4, "sideways")
    with pytest.raises(ValueError, match="kernel = 'flash_x'"):
        ls.drop_renames("", 3, 4, kernel="flash_x")
