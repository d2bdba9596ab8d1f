"""What every command of the harness shares: its help, and how it ends where something it needs
is missing.

Every ``--help`` shows each option's default (``ArgumentParser``). A command that needs what this
machine lacks (a GPU and CuPy, Nsight Compute's ``ncu``) prints one line on stderr naming what is
missing and how to get it, and exits with ``EXIT_MISSING`` (3); a bad argument exits with 2, as
argparse does, and a command that ran but found a failure (``selfcheck``) with 1.
"""

from __future__ import annotations

import argparse
import sys

from ..gpu import GPUUnavailableError

EXIT_MISSING = 3  # something the command needs is not on this machine


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The description as written (the module docstrings are laid out), defaults shown."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose help shows every option's default, including those
    added without a help text."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        if "help" not in kwargs and kwargs.get("action") not in ("help", "version"):
            kwargs["help"] = "default: %(default)s"
        return super().add_argument(*args, **kwargs)


def at_least(minimum: int):
    """An argparse ``type``: an int of at least ``minimum``; anything else is a usage error
    naming the option (exit 2), before the command runs."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"  # what argparse's messages call the type
    return parse


def missing(prog: str, what: str) -> int:
    """Say on one line what ``prog`` needs and this machine lacks; the exit code to return."""
    print(f"{prog}: {what}", file=sys.stderr)
    return EXIT_MISSING


# a package a program imports when it runs, and what to say when it is not installed
NEEDED = {
    "cupy": None,  # said by flashref.gpu: which CuPy for which driver
    "torch": "torch is not installed (pip install torch)",
}


def run(main, prog: str, argv: list[str] | None = None) -> int:
    """``main(argv)``, with a missing GPU, CuPy or torch said on one line (``missing``), the
    exit code ``EXIT_MISSING``: never a traceback for what this machine lacks."""

    try:
        return main(argv)
    except GPUUnavailableError as exc:
        return missing(prog, str(exc))
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in NEEDED:
            raise
        if NEEDED[top] is None:
            from ..gpu import gpu_unavailable_reason

            return missing(prog, f"flashref.gpu cannot run: {gpu_unavailable_reason()}")
        return missing(prog, NEEDED[top])
