"""What a checker returns: a readable report of every case it ran."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

WIDTH = 79  # a report line longer than this puts its problem on the next line
NOT_IMPLEMENTED = "not implemented yet"  # the report for a function that raises NotImplementedError


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
            line = f"- {f.case}: {f.problem}"
            if len(line) > WIDTH and not f.problem.startswith("\n"):
                line = f"- {f.case}:\n  {f.problem}"  # the problem on a line of its own
            lines.append(line)
            if f.diagnosis:
                lines.append(f"  likely mistake: {f.diagnosis}")
        if len(self.failures) > 5:
            lines.append(f"- ... and {len(self.failures) - 5} more")
        return "\n".join(lines)

    __repr__ = __str__


def array_problem(expected: np.ndarray, got) -> str | None:
    """Say why ``got`` is not an array shaped like ``expected``, or None if it is."""
    if not isinstance(got, np.ndarray):
        return f"expected a numpy array, got {type(got).__name__}"
    if got.shape != expected.shape:
        return f"expected shape {expected.shape}, got shape {got.shape}"
    return None
