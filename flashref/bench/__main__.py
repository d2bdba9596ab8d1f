"""The one door to every program of the harness: ``python -m flashref.bench SUBCOMMAND ...``.

``--help`` lists the subcommands by family; ``python -m flashref.bench SUBCOMMAND --help`` shows
one's options and defaults. Each subcommand is the ``main(argv)`` of one module of this package.
"""

from __future__ import annotations

import importlib
import sys

from . import cli

# family -> {subcommand: (the module under flashref.bench whose main() runs it, what it does)}
FAMILIES = {
    "forward": {
        "gpu": ("forward", "every CUDA kernel version vs naive CuPy and torch SDPA backends"),
        "profile": ("profile.main", "Nsight Compute counters of every version, bytes moved"),
        "roofs": ("roofs", "the GPU's ceilings: mma.sync and wgmma peaks, L2 and HBM bandwidth"),
        "hopper_probe": ("hopper_probe", "Hopper's layouts on the GPU, stage by stage"),
    },
    "backward": {
        "backward": ("backward", "each backward version and the public call vs SDPA's"),
    },
    "decode and serving": {
        "decode": ("decode", "the split-KV decode kernels (contiguous, paged) vs SDPA: GB/s"),
        "serving": ("serving", "the paged cache on the GPU, replayed: decode, appends, tokens"),
        "decode_split_sweep": ("decode_split_sweep", "replayed decode time per split count"),
        "decode_host_time": ("decode_host_time", "the host time of the decode calls"),
        "prefill_stamps": ("prefill_stamps", "clock stamps inside the chunked prefill's blocks"),
    },
    "public calls": {
        "calls": ("calls", "the public calls vs SDPA's: host time, one call, graphs, compile"),
        "host_profile": ("host_profile", "where each public call's host time goes"),
    },
    "checks": {
        "selfcheck": ("selfcheck", "every kernel version once against float64 (sanitizers)"),
        "ptx_snapshot": ("ptx_snapshot", "the PTX of every build, compared with an earlier one"),
    },
    "ring": {
        "ring": ("ring", "ring attention over real devices (torch.distributed) or CPU processes"),
    },
    "chapter 8's model": {
        "training": ("training", "the small transformer trained with flashref and with SDPA"),
        "training_step": ("training_step", "where a training step's time goes (torch.profiler)"),
    },
    "CPU": {
        "cpu": ("cpu", "naive vs tiled NumPy attention: time and peak memory"),
    },
}
MODULES = {name: module for family in FAMILIES.values() for name, (module, _) in family.items()}
TARGETS = {name: what for family in FAMILIES.values() for name, (_, what) in family.items()}

USAGE = "usage: python -m flashref.bench SUBCOMMAND [--help] [options]"
MORE = (
    "python -m flashref.bench SUBCOMMAND --help shows a subcommand's options and defaults.\n"
    "Exit codes: 0 done, 1 a check failed, 2 a bad argument, 3 something the command needs\n"
    "(a GPU and CuPy, ncu, nvcc, torch) is not on this machine (one line on stderr says what)."
)


def _listing() -> str:
    width = max(map(len, TARGETS))
    blocks = [
        f"{family}:\n" + "\n".join(f"  {n:{width}s}  {what}" for n, (_, what) in names.items())
        for family, names in FAMILIES.items()
    ]
    return f"{USAGE}\n\n" + "\n".join(blocks) + f"\n\n{MORE}"


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
