"""What versions 29 and 30 say of their compiled code, read in the SASS (versus 27 and 28).

The consumer's steady-state loop (the innermost loop holding a whole tile's wgmma: S = Q K^T
and O += P V) is found in ``cuobjdump -sass`` of the cubin nvcc makes from the text NVRTC is
given, and its instructions are counted: version 29's descriptors live in uniform registers
(no R2UR copies), its stage needs no division by 3 (no IMAD.HI), P's conversions (F2FP) run
before the turn's barrier, not between it and the last wgmma, and the loop is shorter than
version 27's. Version 30 against version 28 (d = 64), which take no turns: the same counts,
P's conversions measured from the consumer's wait for the K/V stage (the first mbarrier
try_wait of the loop) to the last wgmma. Needs nvcc and cuobjdump (skipped with a reason
without them); a failure prints the counts it found.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess

import pytest

from flashref.gpu import KERNEL_DIR, VERSIONS

pytestmark = [
    pytest.mark.nvcc,
    pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump is not on PATH"),
]

SM90A = ["-gencode=arch=compute_90a,code=sm_90a"]
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def _sass(number: int, d: int, tmp_path) -> list[tuple[int, str]]:
    """(address, instruction) of version ``number`` at head dim d, fp16."""
    ver = VERSIONS[number]
    src, cubin = tmp_path / ver.file, tmp_path / f"v{number}_{d}.cubin"
    src.write_text(ver.source())
    cmd = [
        "nvcc",
        *SM90A,
        "-cubin",
        f"-I{KERNEL_DIR}",
        *ver.defines(d, "float16"),
        "--std=c++17",
        "-o",
        str(cubin),
        str(src),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    dump = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True)
    assert dump.returncode == 0, dump.stderr
    return [(int(a, 16), text) for a, text in INSTRUCTION.findall(dump.stdout)]


def _opcode(text: str) -> str:
    words = text.split()
    return words[1] if words[0].startswith("@") else words[0]  # past a predicate


def consumer_loop(sass: list[tuple[int, str]], n_wgmma: int) -> list[str]:
    """The opcodes of the smallest loop (a backward branch's range) with ``n_wgmma`` HGMMA."""
    where = {a: i for i, (a, _) in enumerate(sass)}
    best = None
    for i, (a, text) in enumerate(sass):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)$", text)
        if m and int(m[1], 16) <= a and int(m[1], 16) in where:
            body = [_opcode(t) for _, t in sass[where[int(m[1], 16)] : i + 1]]
            if sum(op.startswith("HGMMA") for op in body) == n_wgmma:
                best = body if best is None or len(body) < len(best) else best
    assert best is not None, f"no loop with {n_wgmma} HGMMA"
    return best


def _counts(loop: list[str], start: str = "BAR.SYNC") -> dict:
    """Counts over the loop; "turn": from its first ``start`` instruction (the turn's barrier,
    or for a version without turns the stage's try_wait) to its last wgmma."""
    turn_start = next(i for i, op in enumerate(loop) if op.startswith(start))
    turn_end = max(i for i, op in enumerate(loop) if op.startswith("HGMMA"))
    kinds = collections.Counter(op.split(".")[0] for op in loop)
    return {
        "instructions": len(loop),
        "R2UR": kinds["R2UR"],
        "IMAD.HI": sum(op.startswith("IMAD.HI") for op in loop),
        "F2FP in the turn": sum(op.startswith("F2FP") for op in loop[turn_start:turn_end]),
        "turn": turn_end - turn_start,
    }


@pytest.mark.parametrize("d", [64, 128])
def test_v29_loop_is_leaner_than_v27s(d, tmp_path):
    n_wgmma = d // 16 + 128 // 16  # S: d / 16 k-steps; P V: Bc / 16 key slices
    v27 = _counts(consumer_loop(_sass(27, d, tmp_path), n_wgmma))
    v29 = _counts(consumer_loop(_sass(29, d, tmp_path), n_wgmma))
    what = f"d = {d}: version 27 {v27}, version 29 {v29}"
    print(f"\n{what}")
    assert v27["R2UR"] > 0 and v29["R2UR"] == 0, what
    assert v29["IMAD.HI"] == 0, what
    assert v29["F2FP in the turn"] == 0, what
    assert v29["turn"] < v27["turn"] and v29["instructions"] < v27["instructions"], what


def test_v30_loop_is_leaner_than_v28s(tmp_path):
    n_wgmma = 64 // 16 + 128 // 16  # d = 64 only
    wait = "SYNCS.PHASECHK"  # the consumer's mbarrier try_wait for the K/V stage
    v28 = _counts(consumer_loop(_sass(28, 64, tmp_path), n_wgmma), wait)
    v30 = _counts(consumer_loop(_sass(30, 64, tmp_path), n_wgmma), wait)
    what = f"d = 64: version 28 {v28}, version 30 {v30}"
    print(f"\n{what}")
    assert v28["R2UR"] > 0 and v30["R2UR"] == 0, what
    assert v28["IMAD.HI"] > 0 and v30["IMAD.HI"] == 0, what
    assert v28["F2FP in the turn"] > 0 and v30["F2FP in the turn"] == 0, what
    assert v30["turn"] < v28["turn"] and v30["instructions"] < v28["instructions"], what
