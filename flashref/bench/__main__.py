"""Entry point: ``python -m flashref.bench {cpu,gpu} [options]``."""

from __future__ import annotations

import importlib
import sys

TARGETS = {
    "cpu": "naive vs tiled NumPy attention: time and peak memory",
    "gpu": "every CUDA kernel version vs naive CuPy and torch SDPA backends",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in TARGETS:
        print("usage: python -m flashref.bench {cpu,gpu} [--help]\n", file=sys.stderr)
        for name, what in TARGETS.items():
            print(f"  {name}  {what}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"flashref.bench.{argv[0]}")
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
