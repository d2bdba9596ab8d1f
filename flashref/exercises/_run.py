"""Running a reader's function on every case: the one loop every checker shares.

For each case the reader's function gets fresh copies of the inputs (it may
modify them) and runs in isolation:

- its warnings are recorded, never raised or printed, whatever the caller's
  warning filters (``python -W error``) or NumPy error state
  (``np.seterr(all="raise")``): it runs under NumPy's default error handling.
  A failed case lists the warnings its call raised; warnings in passing cases
  become one note at the end of the report;
- an exception becomes that case's report line and the next case runs; a
  ``NotImplementedError`` reads "not implemented yet", so a function with one
  branch still to write is checked on the others; an answer that is NaN in every
  value of every case (a placeholder such as ``np.full(shape, np.nan)``) reads
  "every value is NaN" and gets no "likely mistake", unless a named mistake explains
  every one of those cases (rescaling the wrong way overflows everywhere, for one);
- what it returns is accepted or refused by the checker's answer rule
  (``_answer``) before any arithmetic touches it.

Then the checker's own mistake namer looks at the wrong answers, and a failure
left without a name is called float32 precision when the answer lies within the
float32 band of the reference: ``FLOAT32_BAND * U32 * magnitude``, where each
checker's magnitude counts what float32 rounds (for softmax, ``|x| + max|x| + N``
relative to each output; for attention, ``max|S| + d + N`` times ``max|V|``).
Float32 solutions (two-pass, log-sum-exp, online per row, tiled in both loop
orders, flashref's own on float32 inputs) land within 0.62 of ``U32 * magnitude``
on every case (measured); 4 leaves a margin of 6. The named mistakes miss by
orders of magnitude more. A mistake is named only when its simulated output is
wrong by more than that band, or reproduces the answer to float64 rounding
(``_answer.TIGHT``): a float32 answer that misses by a hair never matches a
mistake that differs from the reference only by a hair.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..state import SoftmaxState
from ._answer import type_name
from ._memory import cannot_measure, peak_memory
from ._report import ALL_NAN, NOT_IMPLEMENTED, PRECISION, CheckResult, Failure

U32 = 2.0**-24  # float32's unit roundoff
PLACEHOLDER_TOO = "every value of every case is NaN, as a placeholder answer's would be"
FLOAT32_BAND = 4.0  # see the module docstring


@dataclass
class Case:
    """One input and how to judge an answer to it.

    ``expected`` is the float64 reference, in the form of an accepted answer.
    ``distance(value)`` is a value's worst error in units of the tolerance (> 1
    fails; inf for NaN); ``describe(value)`` says where and how a failing answer is
    wrong; ``within_float32(value)`` whether it lies in the float32 band.
    ``wrong`` is whatever the checker's mistake namer needs. ``memory``, when set,
    measures the call's peak memory and judges it (bytes -> (problem, diagnosis)
    or None) once the answer is right.
    """

    label: str
    args: tuple
    expected: object
    accept: Callable  # got -> (value, None) or (None, problem)
    distance: Callable  # value -> float
    describe: Callable  # value -> str
    within_float32: Callable  # value -> bool
    wrong: object = None  # softmax: () -> [(name, output)]; attention: (mistakes, simulator)
    memory: Callable | None = None


def checker(check: Callable) -> Callable:
    """Run a ``check_*`` function with NumPy's floating-point errors ignored.

    The checker's own references and simulations must not warn or raise whatever
    the caller's ``np.seterr``; the reader's function gets NumPy's defaults back
    inside ``run``.
    """

    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        with np.errstate(all="ignore"):
            return check(*args, **kwargs)

    return wrapper


def check_callable(fn, signature: str) -> None:
    """The one rule for ``fn`` in every checker: callable, or a TypeError before any case."""
    if not callable(fn):
        raise TypeError(f"fn must be a function ({signature}), got {type_name(fn)}")


def copy(a):
    if isinstance(a, SoftmaxState):
        return SoftmaxState(a.m.copy(), a.l.copy(), None if a.o is None else a.o.copy())
    return a.copy() if isinstance(a, np.ndarray) else a


def _heard(caught) -> list[str]:
    """Distinct warning messages, in the order first heard."""
    out = []
    for w in caught:
        text = str(w.message)
        if not issubclass(w.category, RuntimeWarning):
            text = f"{w.category.__name__}: {text}"
        if text not in out:
            out.append(text)
    return out


def run(exercise: str, fn, cases: list[Case], name_mistakes: Callable) -> CheckResult:
    """Call ``fn`` on every case; ``name_mistakes(result, ran)`` names what it can.

    ``ran`` lists ``(case, value, index of its failure or None)`` for every case
    whose answer was accepted (value in float64).
    """
    result = CheckResult(exercise)
    ran, quiet_warnings, warned_cases, placeholders = [], [], 0, 0
    for case in cases:
        result.cases_run += 1
        args = [copy(a) for a in case.args]  # fn may modify its inputs
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with (
                    np.errstate(divide="warn", over="warn", invalid="warn", under="ignore"),
                    peak_memory(case.memory is not None) as peak,
                ):
                    got = fn(*args)
            except NotImplementedError:
                result.failures.append(Failure(case.label, NOT_IMPLEMENTED))
                continue
            except Exception as exc:  # the reader's code raised: report it, keep checking
                result.failures.append(Failure(case.label, f"raised {type(exc).__name__}: {exc}"))
                continue
        heard = _heard(caught)
        with np.errstate(all="ignore"):
            value, problem = case.accept(got)
            diagnosis = None
            if problem is None:
                placeholders += _all_nan(value)
                if case.distance(value) > 1:
                    problem = case.describe(value)
                    ran.append((case, value, len(result.failures)))
                else:
                    ran.append((case, value, None))
                    if case.memory is not None:
                        problem = cannot_measure(peak)
                        if problem is None:
                            problem, diagnosis = case.memory(peak.bytes) or (None, None)
        if problem is None:
            if heard:
                warned_cases += 1
                quiet_warnings += [h for h in heard if h not in quiet_warnings]
            continue
        if heard:
            problem += f"\n  warned: {'; '.join(heard)}"
        result.failures.append(Failure(case.label, problem, diagnosis))
    with np.errstate(all="ignore"):
        if any(index is not None for _, _, index in ran):
            name_mistakes(result, ran)
        _name_precision(result, ran)
    if ran and placeholders == len(ran):  # NaN everywhere: a placeholder, unless a mistake
        named = [result.failures[i].diagnosis for case, _, i in ran if case.wrong is not None]
        if not all(named):  # (cases with no mistakes to simulate, the memory cases, aside)
            for _, _, index in ran:  # (a NaN never passes, so every one of them failed)
                result.failures[index] = Failure(result.failures[index].case, ALL_NAN)
        else:
            result.notes.append(PLACEHOLDER_TOO)
    if warned_cases:
        cases_text = "1 passing case" if warned_cases == 1 else f"{warned_cases} passing cases"
        result.notes.append(f"the function warned in {cases_text}: {'; '.join(quiet_warnings)}")
    return result


def _arrays(value) -> list[np.ndarray]:
    if isinstance(value, SoftmaxState):
        return [np.asarray(x) for x in (value.m, value.l, value.o) if x is not None]
    if isinstance(value, (tuple, list)):
        return [a for x in value for a in _arrays(x)]
    return [np.asarray(value)] if isinstance(value, (np.ndarray, float, np.floating)) else []


def _all_nan(value) -> bool:
    """Whether every number of an accepted answer is NaN (a placeholder, not an attempt)."""
    arrays = [a for a in _arrays(value) if a.dtype.kind in "fc" and a.size]
    return bool(arrays) and all(np.isnan(a).all() for a in arrays)


def _name_precision(result: CheckResult, ran) -> None:
    """Call a failure with no named mistake float32 precision when it is in the band."""
    for case, value, index in ran:
        if index is None or result.failures[index].diagnosis:
            continue
        if case.within_float32(value):
            f = result.failures[index]
            result.failures[index] = Failure(f.case, f.problem, PRECISION)


def float32_band(magnitude):
    """The float32 band's tolerance for a given magnitude (see the module docstring)."""
    return FLOAT32_BAND * U32 * magnitude


def name_with(diagnose: Callable) -> Callable:
    """A ``name_mistakes`` for ``run``: ``diagnose(case, value)`` lists the mistakes that explain
    a failed case, and they are written on its report line, joined by "or"."""

    def name_mistakes(result: CheckResult, ran) -> None:
        for case, value, index in ran:
            if index is None or case.wrong is None:
                continue
            names = diagnose(case, value)
            if names:
                f = result.failures[index]
                result.failures[index] = Failure(f.case, f.problem, " or ".join(names))

    return name_mistakes
