"""The checker for chapter 5's exercise: who holds which element of an ``mma.sync`` operand.

``check_mma_fragment(fn)`` runs ``fn(operand, lane, reg, half)`` for every lane (0..31) and
register of the A operand (16 x 16 fp16, ``operand="A"``, registers a0..a3, each two 16-bit
halves, ``half`` 0 the low one) and of the accumulator C (16 x 8 fp32, ``operand="C"``,
registers c0..c3, one value each, ``half`` always 0) of ``mma.sync.aligned.m16n8k16``, and
wants the ``(row, col)`` of the element that half of that register holds (for A, ``col`` is
``k``).

The answers are compared exactly with ``flashref.hardware.fragments`` (``mma_a``,
``mma_c``), which ``tests/gpu/test_fragments.py`` checks against the PTX ISA's formulas and, on
a GPU, against what a probe kernel's lanes hold; a wrong map is checked against the mistakes
of ``_mma_mistakes`` (``tests/exercises/test_exercises_mma.py`` plants each).
"""

from __future__ import annotations

from ..hardware import fragments as fr
from . import _mma_mistakes as mm
from ._exact import check_exercise
from ._report import CheckResult
from ._run import checker

__all__ = ["check_mma_fragment"]


@checker
def check_mma_fragment(fn) -> CheckResult:
    """Check ``fn(operand, lane, reg, half) -> (row, col)`` for the A and C fragments of
    ``mma.m16n8k16`` (see the module docstring)."""
    a = [("A", lane, reg, half) for lane in range(32) for reg in range(4) for half in range(2)]
    c = [("C", lane, reg, 0) for lane in range(32) for reg in range(4)]
    cases = [
        (
            "A (16 x 16, fp16): 32 lanes x 4 registers x 2 halves",
            a,
            [fr.mma_a(*p[1:]) for p in a],
            2,
            "(row, col)",
            "fn",
            mm.a_candidates,
            None,
        ),
        (
            "C (16 x 8, fp32): 32 lanes x 4 registers",
            c,
            [fr.mma_c(*p[1:3]) for p in c],
            2,
            "(row, col)",
            "fn",
            mm.c_candidates,
            None,
        ),
    ]
    return check_exercise(
        "check_mma_fragment", fn, "fn(operand, lane, reg, half) -> (row, col)", cases
    )
