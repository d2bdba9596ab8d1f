"""Where the warps of one forward version stall, instruction by instruction.

    python -m flashref.bench profile --source VERSION [--source-out PATH]

Nsight Compute's warp-state sampling (``--page source --print-source sass``) over
``python -m flashref.bench.profile.ncu_target``, the kernels compiled with ``-lineinfo``: for each
kernel, the share of the samples that fell on each SASS opcode and on each stall reason, and
the top stall reasons of the top opcodes (``summarise_source_csv``). Written by
``flashref.bench.profile`` to ``results/gpu_stall_sampling.json`` by default.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from .ncu import ncu_number

SOURCE_SECTIONS = ("SourceCounters", "WarpStateStats")


def summarise_source_csv(text: str) -> list[dict]:
    """Per kernel of an ``ncu --page source --print-source sass --csv`` log: the share of the
    warp-state samples that fell on each SASS opcode, and on each stall reason."""
    import collections
    import io

    lines = text.splitlines()
    names = [ln.split(",")[1].strip('"') for ln in lines if ln.startswith('"Kernel Name"')]
    starts = [i for i, ln in enumerate(lines) if ln.startswith('"Address"')]
    out = []
    for n, start in enumerate(starts):
        end = starts[n + 1] - 1 if n + 1 < len(starts) else len(lines)
        rows = list(csv.reader(io.StringIO("\n".join(lines[start:end]))))
        header, body = rows[0], [r for r in rows[1:] if len(rows[0]) == len(r)]
        col = {h: i for i, h in enumerate(header)}
        stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
        by_op, by_stall = collections.Counter(), collections.Counter()
        op_stall: dict = collections.defaultdict(collections.Counter)
        for r in body:
            words = r[col["Source"]].split()
            if not words:
                continue
            op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
            samples = ncu_number(r[col["Warp Stall Sampling (All Samples)"]]) or 0.0
            by_op[op] += samples
            for st in stalls:
                v = ncu_number(r[col[st]]) or 0.0
                by_stall[st[6:]] += v
                op_stall[op][st[6:]] += v
        total = sum(by_op.values()) or 1.0
        out.append(
            {
                "kernel": names[n] if n < len(names) else None,
                "samples": total,
                "opcode_share": {k: v / total for k, v in by_op.most_common(15)},
                "stall_share": {k: v / total for k, v in by_stall.most_common()},
                "opcode_stall_share": {
                    k: {s: v / total for s, v in op_stall[k].most_common(5)}
                    for k, _ in by_op.most_common(8)
                },
            }
        )
    return out


def source_profile(plan: list[dict], workdir: Path, kernel: str = "regex:^flash_v") -> list[dict]:
    """Warp-state sampling per SASS instruction (the kernels compiled with -lineinfo) of the
    kernels whose name ``kernel`` (ncu's -k) matches: the forward versions by default."""
    plan_path, log = workdir / "plan.json", workdir / "source.csv"
    plan_path.write_text(json.dumps(plan))
    env = {**os.environ, "FLASHREF_NVRTC_FLAGS": "-lineinfo"}
    cmd = [
        "ncu",
        "--profile-from-start",
        "off",
        "--clock-control",
        "none",
        "-k",
        kernel,
        *(a for s in SOURCE_SECTIONS for a in ("--section", s)),
        "--csv",
        "--page",
        "source",
        "--print-source",
        "sass",
        "--log-file",
        str(log),
        sys.executable,
        "-m",
        "flashref.bench.profile.ncu_target",
        str(plan_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"ncu failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return summarise_source_csv(log.read_text())
