"""Entry point: ``python -m flashref.bench {cpu,gpu,decode,serving,calls,profile,roofs} ...``."""

from __future__ import annotations

import importlib
import sys

from . import cli

# subcommand -> the module under flashref.bench whose main() runs it
MODULES = {"cpu": "cpu", "gpu": "forward", "decode": "decode", "serving": "serving",
           "calls": "calls",
           "profile": "profile.main", "roofs": "roofs"}  # fmt: skip
TARGETS = {
    "cpu": "naive vs tiled NumPy attention: time and peak memory",
    "gpu": "every CUDA kernel version vs naive CuPy and torch SDPA backends",
    "decode": "the split-KV decode kernels (contiguous, paged) vs SDPA: GB/s of K/V read",
    "serving": "the paged cache on the GPU, replayed: paged decode vs cuDNN, appends vs copy_",
    "calls": "the public calls vs SDPA's: host time, one call, back to back, graphs, compile",
    "profile": "Nsight Compute counters for every version, and the bytes attention moves",
    "roofs": "the GPU's measured ceilings: mma.sync and wgmma peaks, L2 and HBM bandwidth",
}


USAGE = (
    "usage: python -m flashref.bench {cpu,gpu,decode,serving,calls,profile,roofs} [--help] "
    "[options]"
)
MORE = (
    "python -m flashref.bench SUBCOMMAND --help shows a subcommand's options and defaults.\n"
    "Exit codes: 0 done, 1 a check failed, 2 a bad argument, 3 something the command needs\n"
    "(a GPU and CuPy, ncu) is not on this machine (one line on stderr says what)."
)


def _listing() -> str:
    rows = "\n".join(f"  {name:8s} {what}" for name, what in TARGETS.items())
    return f"{USAGE}\n\nsubcommands:\n{rows}\n\n{MORE}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(_listing())
        return 0
    if not argv or argv[0] not in TARGETS:
        what = f"unknown subcommand {argv[0]!r}\n" if argv else ""
        print(f"{what}{_listing()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"flashref.bench.{MODULES[argv[0]]}")
    return cli.run(module.main, f"python -m flashref.bench {argv[0]}", argv[1:])


if __name__ == "__main__":
    sys.exit(main())
