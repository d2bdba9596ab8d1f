"""The PTX of every build of every kernel family, to show that a change of the sources' text
(a move, a shared header, a file written out whole) leaves the compiled code as it was.

    python -m flashref.bench ptx_snapshot OUT                 # write OUT/<build>.ptx, manifest
    python -m flashref.bench ptx_snapshot OUT --compare BEFORE  # ... and compare with BEFORE
    python -m flashref.bench ptx_snapshot OUT --compare BEFORE --entries  # ... function by function

A build is one (version, d, dtype) of the forward and backward registries, one (version, d,
rows, dtype) of the decode versions, the backward's preprocess and dQ conversion, one (d,
dtype) of the chunked prefill (``paged_prefill.cu``), the paged cache's append kernels
(``paged_cache.cu``; NVRTC targets the GPU it runs on, here sm_90), and each probe and
ceiling kernel: the text NVRTC is given (headers pasted in) through ``nvcc -ptx``
with the same defines and target. Needs nvcc, no GPU. ``OUT/manifest.json`` holds the
SHA-256 of each file with nvcc's version; ``--compare`` prints the builds whose PTX differs
or is missing in either folder and exits 1 if there is any.

``--entries``: where a build's whole file differs, its functions (``.entry``, ``.func``) are
compared one by one with BEFORE's of the same name (``entries``): for a change that drops
kernels a module no longer needs, or moves kernels between the files of one module, so that
the kernels that remain are the same but the file is not. It prints each such build with the
functions only BEFORE had, and exits 1 if any function of OUT differs or is new.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..gpu.backward_versions import BWD_VERSIONS, pre_post_source
from ..gpu.decode import cache, prefill
from ..gpu.decode import versions as decode
from ..gpu.forward_versions import VERSIONS
from ..gpu.registry import DTYPE_DEFINES, KERNEL_DIR, paste_includes
from . import cli
from ._common import write_result
from .cli import ArgumentParser

SM90 = "-arch=sm_90"


PROG = "python -m flashref.bench ptx_snapshot"


def builds() -> list[tuple[str, str, list[str]]]:
    """(label, source text, nvcc flags) of every build."""

    out = []
    for family, table in (("fwd", VERSIONS), ("bwd", BWD_VERSIONS)):
        for v in table.values():
            arch = f"-arch={v.arch}" if v.arch else SM90
            for dtype in v.dtypes:
                dims = [d for d in (64, 128) if d in v.head_dims]
                dims += [37] if dtype == "float32" else []  # the fp32 versions take any d
                for d in dims:
                    label = f"{family}{v.number:02d}_d{d}_{dtype}"
                    out.append((label, v.source(), [arch, *v.defines(d, dtype)]))
    for d in (64, 128):
        for dtype in ("float16", "bfloat16"):
            flags = [SM90, f"-DHEAD_DIM={d}", *DTYPE_DEFINES[dtype]]
            out.append((f"bwd_pre_post_d{d}_{dtype}", pre_post_source(), flags))
    for v in decode.VERSIONS.values():
        arch = f"-arch={v.arch}" if v.arch else SM90
        for d in (64, 128):
            for rows in (1, 2):
                for dtype in ("float16", "bfloat16"):
                    label = f"dec{v.number:02d}_d{d}_rt{rows}_{dtype}"
                    out.append((label, v.source(), [arch, *decode.defines(d, rows, dtype)]))
    for d in (64, 128):
        for dtype in ("float16", "bfloat16"):
            flags = ["-arch=sm_90a", *prefill.defines(d, dtype)]
            out.append((f"paged_prefill_d{d}_{dtype}", prefill.source(), flags))
    out.append(("paged_cache", cache.source(), [SM90]))
    for path in sorted((KERNEL_DIR / "probes").glob("*.cu")):
        out.append((f"probe_{path.stem}", paste_includes(path), ["-arch=sm_90a"]))
    return out


def _build(job, folder: Path) -> str | None:
    label, text, flags = job
    with tempfile.TemporaryDirectory(prefix="flashref-ptx-") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(text)
        cmd = ["nvcc", "-ptx", *flags, "-o", str(folder / f"{label}.ptx"), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    return None if proc.returncode == 0 else f"{label}: {' '.join(cmd)}\n{proc.stderr}"


def snapshot(folder: Path, jobs=None) -> dict:
    """Build every PTX into ``folder``; return and write the manifest {label: sha256}."""
    folder.mkdir(parents=True, exist_ok=True)
    jobs = builds() if jobs is None else jobs
    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        failed = [e for e in pool.map(lambda j: _build(j, folder), jobs) if e]
    if failed:
        raise RuntimeError("nvcc failed:\n" + "\n".join(failed))
    digests = {
        label: hashlib.sha256((folder / f"{label}.ptx").read_bytes()).hexdigest()
        for label, _, _ in jobs
    }
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    manifest = {"nvcc": nvcc.strip().splitlines()[-1], "ptx_sha256": digests}
    write_result(manifest, folder / "manifest.json")
    return manifest


def compare(before: dict, after: dict) -> list[str]:
    """The builds whose PTX differs, or that only one of the two manifests has."""
    a, b = before["ptx_sha256"], after["ptx_sha256"]
    lines = [f"differs: {k}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    lines += [f"only before: {k}" for k in sorted(a.keys() - b.keys())]
    lines += [f"only after: {k}" for k in sorted(b.keys() - a.keys())]
    return lines


_FUNCTION = re.compile(
    r"^(?:\.visible |\.weak )?\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)", re.M
)
_GLOBL = re.compile(r"(?:\n[ \t]*// \.globl\s+\S+\s*)+$")  # the next function's first line


def entries(ptx: str) -> dict[str, str]:
    """Each function of a PTX module by name, from its ``.entry`` or ``.func`` line to the next
    function's, with the numbers nvcc gives by the function's place in the module (its basic
    blocks' labels ``$L__BB<i>_<n>``, its ``__local_depot<i>``) written ``#``: two modules
    whose functions are the same, but fewer or in another order, compare equal by function."""
    starts = [m.start() for m in _FUNCTION.finditer(ptx)]
    out = {}
    for a, b in zip(starts, [*starts[1:], len(ptx)], strict=True):
        text = _GLOBL.sub("\n", ptx[a:b])
        text = re.sub(r"\$L__BB\d+_", "$L__BB#_", text)
        out[_FUNCTION.match(text).group(1)] = re.sub(r"__local_depot\d+", "__local_depot#", text)
    return out


def compare_entries(before: Path, after: Path, labels) -> tuple[list[str], list[str]]:
    """For each build of ``labels`` (whose whole files differ): (lines naming the functions of
    ``after`` that differ from ``before``'s or are new, lines naming the builds whose
    functions are all the same and the functions only ``before`` has)."""
    bad, same = [], []
    for label in labels:
        a = entries((before / f"{label}.ptx").read_text())
        b = entries((after / f"{label}.ptx").read_text())
        differ = [f"differs: {label}: {n}" for n in b if n in a and a[n] != b[n]]
        differ += [f"only after: {label}: {n}" for n in b if n not in a]
        bad += differ
        if not differ:
            gone = ", ".join(n for n in a if n not in b) or "none"
            same.append(f"same functions: {label} ({len(b)}; only before: {gone})")
    return bad, same


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog=PROG,
        description=__doc__,
    )
    parser.add_argument("out", type=Path, help="folder for the PTX files and manifest.json")
    parser.add_argument("--compare", type=Path, metavar="BEFORE", help="an earlier OUT folder")
    parser.add_argument(
        "--entries",
        action="store_true",
        help="with --compare: compare the builds that differ function by function",
    )
    args = parser.parse_args(argv)
    if subprocess.run(["which", "nvcc"], capture_output=True).returncode != 0:
        return cli.missing(PROG, "nvcc (the CUDA compiler) is not on PATH: nothing built")
    manifest = snapshot(args.out)
    print(f"{len(manifest['ptx_sha256'])} builds written to {args.out} ({manifest['nvcc']})")
    if args.compare is None:
        return 0
    before = json.loads((args.compare / "manifest.json").read_text())
    lines = compare(before, manifest)
    same = len(before["ptx_sha256"].keys() & manifest["ptx_sha256"].keys()) - sum(
        line.startswith("differs") for line in lines
    )
    print(f"byte-identical to {args.compare}: {same}; other: {len(lines)}")
    print("\n".join(lines))
    if not args.entries or any(not line.startswith("differs") for line in lines):
        return 1 if lines else 0
    differ = [line.split(": ", 1)[1] for line in lines]
    bad, kept = compare_entries(args.compare, args.out, differ)
    print(f"of the {len(differ)} that differ, the same function by function: {len(kept)}")
    print("\n".join(kept + bad))
    return 1 if bad else 0
