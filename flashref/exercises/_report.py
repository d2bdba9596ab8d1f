"""What a checker returns: a readable report of every case it ran."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Failure:
    """One failed case: what the input was, and what went wrong."""

    case: str  # e.g. "x (3, 37), block_size=5"
    problem: str  # e.g. "row 2, column 9: expected 0.0312, got 0.5"
    diagnosis: str | None = None  # the named mistake, when recognised


@dataclass
class CheckResult:
    """The outcome of one checker run; prints as a report, truthy when all passed."""

    exercise: str
    cases_run: int = 0
    failures: list[Failure] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.cases_run > 0 and not self.failures

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        if self.passed:
            return f"{self.exercise}: all {self.cases_run} cases passed"
        lines = [
            f"{self.exercise}: {len(self.failures)} of {self.cases_run} cases failed",
        ]
        for f in self.failures[:5]:
            lines.append(f"- {f.case}: {f.problem}")
            if f.diagnosis:
                lines.append(f"  likely mistake: {f.diagnosis}")
        if len(self.failures) > 5:
            lines.append(f"- ... and {len(self.failures) - 5} more")
        return "\n".join(lines)

    __repr__ = __str__


def first_mismatch(expected: np.ndarray, got, rtol: float, atol: float) -> str | None:
    """Describe the first way ``got`` differs from ``expected``, or None if it matches.

    Checks type, shape, NaN and then values (NaN-safe: a NaN where a number is
    expected fails), reporting the index of the worst element.
    """
    if not isinstance(got, np.ndarray):
        return f"expected a numpy array, got {type(got).__name__}"
    if got.shape != expected.shape:
        return f"expected shape {expected.shape}, got shape {got.shape}"
    g = got.astype(np.float64)
    bad_nan = np.isnan(g) & ~np.isnan(expected)
    if bad_nan.any():
        idx = tuple(int(i) for i in np.argwhere(bad_nan)[0])
        return f"NaN at index {idx} where {expected[idx]:.6g} was expected"
    with np.errstate(invalid="ignore"):
        err = np.abs(g - expected)
        err = np.where(np.isnan(err), np.where(np.isnan(g) == np.isnan(expected), 0, np.inf), err)
        err = np.where(np.isinf(expected) & (g == expected), 0, err)
    tol = atol + rtol * np.abs(np.where(np.isfinite(expected), expected, 0))
    if (err <= tol).all():
        return None
    idx = tuple(int(i) for i in np.unravel_index(np.argmax(err - tol), err.shape))
    return f"at index {idx}: expected {expected[idx]:.6g}, got {g[idx]:.6g}"
