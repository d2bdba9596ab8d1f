"""What the exercise tests read in a checker's report, written once for every chapter's tests."""

from __future__ import annotations


def flat(result) -> str:
    """A report on one line: a long mistake name is wrapped over several lines when printed."""
    return " ".join(str(result).split())


def assert_named(result, name):
    """The report fails, says ``likely mistake: <name>``, and every diagnosis is ``name``."""
    text = flat(result)
    assert not result
    assert f"likely mistake: {' '.join(name.split())}" in text, text
    diagnosed = [f.diagnosis for f in result.failures if f.diagnosis]
    assert diagnosed and all(d == name for d in diagnosed), diagnosed


def assert_not_implemented_line(checker):
    """A placeholder that raises NotImplementedError everywhere reads as one plain line."""

    def todo(*args):
        raise NotImplementedError

    result = checker(todo)
    assert str(result) == (
        f"{checker.__name__}: not implemented yet "
        f"(all {result.cases_run} cases raised NotImplementedError)"
    )
