"""What each backward version changes (``flashref.gpu.backward_versions.base_of``, ``kernel_diff``).

No GPU and no CuPy needed: the headers and sources of the .cu files are read as text.
"""

from __future__ import annotations

import pytest

from flashref.gpu import backward_versions as bv


def _changed(diff: str) -> list[str]:
    return [x for x in diff.splitlines() if x[:1] in "+-" and not x.startswith(("---", "+++"))]


def test_base_of_reads_the_header():
    assert bv.base_of(1) is None  # the first version builds on none
    assert bv.base_of(2) == 1 and bv.base_of(3) == 1 and bv.base_of(4) == 3


def test_every_later_version_names_an_earlier_registered_base():
    for number in bv.BWD_VERSIONS:
        base = bv.base_of(number)
        if number == min(bv.BWD_VERSIONS):
            assert base is None, f"bwd{number}: the first version names a base, {base}"
        else:
            assert base in bv.BWD_VERSIONS and base < number, (
                f"bwd{number}'s header names base {base}; expected an earlier version of "
                f"{sorted(bv.BWD_VERSIONS)}"
            )


def test_kernel_diff_shows_only_what_a_version_changed():
    diff = bv.kernel_diff(3, 4)
    assert diff.splitlines()[:2] == ["--- bwd03_bc128.cu", "+++ bwd04_red_pairs.cu"]
    changed = _changed(diff)
    assert any("red_add_v2(" in x for x in changed if x.startswith("+"))  # the change itself
    assert any("atomicAdd(" in x for x in changed if x.startswith("-"))
    assert not any(x[1:].lstrip().startswith("//") for x in changed)  # headers left out
    assert len(changed) <= 10, "\n".join(changed)  # the unchanged kernel is not shown


def test_kernel_diff_of_the_separate_dq_pass():
    changed = _changed(bv.kernel_diff(1, 2))
    assert any("flash_bwd2_dq(" in x for x in changed if x.startswith("+"))
    assert any("atomicAdd(" in x for x in changed if x.startswith("-"))
    assert not any("atomicAdd(" in x for x in changed if x.startswith("+"))


def test_kernel_diff_of_the_smaller_block():
    changed = _changed(bv.kernel_diff(6, 7))
    added = [x for x in changed if x.startswith("+")]
    assert any("#define NWARPS 4" in x for x in added)
    assert any("__launch_bounds__(NTHREADS, MIN_BLOCKS)" in x for x in added)
    assert any("flash_bwd7(" in x for x in added)
    assert any("#define NWARPS 8" in x for x in changed if x.startswith("-"))
    assert len(changed) <= 40, "\n".join(changed)  # of a 200-line kernel


def test_a_version_against_itself_has_no_changes():
    assert _changed(bv.kernel_diff(1, 1)) == []


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: bv.kernel_diff(0, 2), ValueError, "old must be one of"),
        (lambda: bv.kernel_diff(1, 99), ValueError, "new must be one of"),
        (lambda: bv.kernel_diff(1, "2"), TypeError, "new must be an int, got str"),
        (lambda: bv.kernel_diff(True, 2), TypeError, "old must be an int, got bool"),
        (lambda: bv.base_of(1.0), TypeError, "number must be an int, got float"),
        (lambda: bv.code_lines(-1), ValueError, "number must be one of"),
    ],
)
def test_bad_numbers_are_named(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
