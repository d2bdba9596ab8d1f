"""What a checker returns: a readable report of every case it ran."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

WIDTH = 79  # a report line longer than this puts its problem on the next line
NOT_IMPLEMENTED = "not implemented yet"  # the report for a function that raises NotImplementedError
# the report for an answer whose every value is NaN (a placeholder such as np.full(shape, np.nan))
ALL_NAN = "every value is NaN: not implemented yet, or a placeholder answer"
PRECISION = "float32 precision: compute in float64, like the inputs"


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
    notes: list[str] = field(default_factory=list)  # printed last, pass or fail

    @property
    def passed(self) -> bool:
        return self.cases_run > 0 and not self.failures

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        if self.passed:
            lines = [f"{self.exercise}: all {self.cases_run} cases passed"]
        elif (
            all(f.problem in (NOT_IMPLEMENTED, ALL_NAN) for f in self.failures)
            and len(self.failures) == self.cases_run
        ):
            how = {f.problem for f in self.failures}
            what = (
                "raised NotImplementedError"
                if how == {NOT_IMPLEMENTED}
                else "returned only NaN"
                if how == {ALL_NAN}
                else "raised NotImplementedError or returned only NaN"
            )
            lines = [f"{self.exercise}: {NOT_IMPLEMENTED} (all {self.cases_run} cases {what})"]
        else:
            lines = [f"{self.exercise}: {len(self.failures)} of {self.cases_run} cases failed"]
            for f in self.failures[:5]:
                line = f"- {f.case}: {f.problem}"
                if len(line) > WIDTH or "\n" in f.problem:
                    line = f"- {f.case}:\n  {f.problem}"  # the problem on lines of its own
                lines.append(line)
                if f.diagnosis:  # wrapped to the report's width
                    lines += textwrap.wrap(
                        f.diagnosis,
                        WIDTH,
                        initial_indent="  likely mistake: ",
                        subsequent_indent="    ",
                        break_on_hyphens=False,
                    )
            if len(self.failures) > 5:
                lines.append(f"- ... and {len(self.failures) - 5} more")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    __repr__ = __str__
