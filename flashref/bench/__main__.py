"""Entry point: ``python -m flashref.bench {cpu,gpu,decode,profile,roofs} [options]``."""

from __future__ import annotations

import importlib
import sys

# subcommand -> the module under flashref.bench whose main() runs it
MODULES = {"cpu": "cpu", "gpu": "forward", "decode": "decode", "profile": "profile.main",
           "roofs": "roofs"}  # fmt: skip
TARGETS = {
    "cpu": "naive vs tiled NumPy attention: time and peak memory",
    "gpu": "every CUDA kernel version vs naive CuPy and torch SDPA backends",
    "decode": "the split-KV decode kernels (contiguous, paged) vs SDPA: GB/s of K/V read",
    "profile": "Nsight Compute counters for every version, and the bytes attention moves",
    "roofs": "the GPU's measured ceilings: mma.sync and wgmma peaks, L2 and HBM bandwidth",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in TARGETS:
        print(
            "usage: python -m flashref.bench {cpu,gpu,decode,profile,roofs} [--help]\n",
            file=sys.stderr,
        )
        for name, what in TARGETS.items():
            print(f"  {name:8s} {what}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"flashref.bench.{MODULES[argv[0]]}")
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
