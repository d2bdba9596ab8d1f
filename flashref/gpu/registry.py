"""What every numbered kernel version has, forward, backward or decode: one file, its text.

``KernelVersion`` is the base of ``forward_versions.Version``, ``backward_versions.BwdVersion``
and ``decode.versions.DecodeVersion``: a version is one ``.cu`` file in its family's folder
under ``flashref/kernels/`` (``forward/``, ``hopper/``, ``backward/``, ``decode/``), compiled
at run time by NVRTC with the headers it includes pasted in. Nothing here imports CuPy, so a
registry can be read, and its sources compiled with nvcc, on a machine without a GPU.
"""

from __future__ import annotations

import numbers
import re
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels"
COMMON_DIR = KERNEL_DIR / "common"  # the PTX wrappers every family includes

# dtype name -> extra NVRTC/nvcc defines; the 16-bit floats share one code path
DTYPE_DEFINES = {"float32": (), "float16": (), "bfloat16": ("-DFLASHREF_BF16",)}

# a header or a .cu, its name alone or with one folder of kernels/ ("hopper/consumer_loop.cuh")
_INCLUDE = re.compile(r'^#include "((?:[A-Za-z0-9_]+/)?[A-Za-z0-9_]+\.cuh?)".*$', re.MULTILINE)


def find_include(name: str, folder: Path) -> Path:
    """Where ``#include "name"`` in a file of ``folder`` resolves: that folder first, then
    ``kernels/common/`` (as ``nvcc -I<folder> -I<kernels/common>`` would look). A name with a
    folder, ``"hopper/consumer_loop.cuh"``, is a header of another family, named where it is:
    it resolves under ``kernels/`` alone (``nvcc -I<kernels>``), as the serving kernels in
    ``decode/`` take the Hopper forward's pieces."""
    if "/" in name:
        if (KERNEL_DIR / name).is_file():
            return KERNEL_DIR / name
        raise FileNotFoundError(f'#include "{name}" in {folder}: not in {KERNEL_DIR}')
    for where in (folder, COMMON_DIR):
        if (where / name).is_file():
            return where / name
    raise FileNotFoundError(f'#include "{name}" in {folder}: not in {folder} nor {COMMON_DIR}')


def paste_includes(path: Path) -> str:
    """The text of ``path`` with each ``#include "x.cuh"`` (or ``"x.cu"``, a version another
    version builds on) replaced by that file's text (``find_include``), nested ones too.

    NVRTC could take include paths instead, but CuPy's on-disk kernel cache keys on the
    source string: pasting the files in makes an edit of any of them recompile.
    """
    path = Path(path)
    return _INCLUDE.sub(
        lambda m: paste_includes(find_include(m.group(1), path.parent)), path.read_text()
    )


class KernelVersion:
    """The part every registry's version shares. A subclass is a frozen dataclass with at
    least ``number``, ``name``, ``file`` (the file's name in ``folder``), ``min_cc`` (lowest
    compute capability, (major, minor)) and ``arch`` (an architecture-specific target such as
    "sm_90a", or None), and says its ``folder`` under ``flashref/kernels/`` and its ``kind``
    (how errors name it: "backward " for "backward version 8 (wgmma)")."""

    kind = ""
    folder = ""
    # how the first line of the file's header names the version it builds on
    base_pattern = re.compile(r"// (?:\w+ )?version \d+: version (\d+)\b")

    @property
    def path(self) -> Path:
        return KERNEL_DIR / self.folder / self.file

    def source(self) -> str:
        """The .cu text with its includes pasted in (``paste_includes``)."""
        return paste_includes(self.path)

    def defines(self, d: int, dtype: str) -> tuple[str, ...]:
        return (f"-DHEAD_DIM={d}", *DTYPE_DEFINES[dtype])

    def nvrtc_options(self) -> tuple[str, ...]:
        """Options beyond the common ones: the architecture-specific target, if any."""
        return (f"-arch={self.arch}",) if self.arch else ()

    def runs_on(self, cc: tuple[int, int]) -> bool:
        """Whether a GPU of compute capability ``cc`` (major, minor) has its instructions: an
        architecture-specific version (``arch``) runs on that compute capability alone."""
        return tuple(cc) == self.min_cc if self.arch else tuple(cc) >= self.min_cc

    def code_lines(self) -> list[str]:
        """The lines of the .cu file after its header comment."""
        lines = self.path.read_text().splitlines()
        first = next(i for i, line in enumerate(lines) if not line.startswith("//"))
        return lines[first:]

    def base_number(self) -> int | None:
        """The version this one changes, as its header's first line names it
        (``// version 22: version 21 with ...``), or None where it names none."""
        m = self.base_pattern.match(self.path.read_text().splitlines()[0])
        return int(m.group(1)) if m else None


def registered(table: dict, number, name: str):
    """``table[number]``, with a TypeError or ValueError naming the argument ``name``."""
    if isinstance(number, bool) or not isinstance(number, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(number).__name__}")
    if number not in table:
        raise ValueError(f"{name} must be one of {sorted(table)}, got {number}")
    return table[int(number)]


def diff_code(old_file: str, a: list[str], new_file: str, b: list[str]) -> str:
    """What changed from code lines ``a`` to ``b``: lines matched by their text without
    leading spaces, so a block that only moved in or out by a level of indentation does not
    show as changed; changed lines are printed as the files have them, ``-`` for the old
    version's lines and ``+`` for the new one's."""
    import difflib

    out = [f"--- {old_file}", f"+++ {new_file}"]
    matcher = difflib.SequenceMatcher(None, [x.strip() for x in a], [x.strip() for x in b])
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        out.append(f"@@ -{i1 + 1},{i2 - i1} +{j1 + 1},{j2 - j1} @@")
        out += [f"-{line}" for line in a[i1:i2]] + [f"+{line}" for line in b[j1:j2]]
    return "\n".join(out)


def version_diff(old: KernelVersion, new: KernelVersion) -> str:
    """``diff_code`` of two versions' code lines, header comments left out."""
    return diff_code(old.file, old.code_lines(), new.file, new.code_lines())
