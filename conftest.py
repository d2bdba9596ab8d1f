"""Project-wide pytest hooks.

GPU work is opt-in by hardware, never by hand: tests marked ``gpu`` and
notebook cells tagged ``gpu`` run when CuPy can see a CUDA device and are
skipped, with the reason printed (``pytest -ra``), everywhere else. Likewise tests
marked ``nvcc`` need the CUDA compiler, and notebook cells tagged ``nvcc`` need it and
``cuobjdump`` (they read a kernel's machine code).
"""

from __future__ import annotations

import functools
import shutil

import pytest


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """None if CuPy can see a CUDA GPU; otherwise why not (asked once per test run)."""
    from flashref.gpu import gpu_unavailable_reason as reason  # imports no CuPy by itself

    return reason()


def _is_notebook_cell(item, tag: str) -> bool:
    cell = getattr(item, "cell", None)  # nbval's IPyNbCell carries the notebook cell
    return cell is not None and tag in cell.get("metadata", {}).get("tags", [])


# what a notebook cell tagged nvcc runs (it compiles a kernel and reads its machine code)
CELL_TOOLS = ("nvcc", "cuobjdump")


def pytest_collection_modifyitems(config, items):
    gpu_reason = None
    nvcc_reason = None if shutil.which("nvcc") else "nvcc (the CUDA compiler) is not on PATH"
    missing = [t for t in CELL_TOOLS if not shutil.which(t)]
    tools_reason = f"{' and '.join(missing)} not on PATH" if missing else None
    for item in items:
        if item.get_closest_marker("gpu") or _is_notebook_cell(item, "gpu"):
            gpu_reason = gpu_reason or gpu_unavailable_reason()
            if gpu_reason:
                item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {gpu_reason}"))
        if item.get_closest_marker("nvcc") and nvcc_reason:
            item.add_marker(pytest.mark.skip(reason=nvcc_reason))
        if _is_notebook_cell(item, "nvcc") and tools_reason:
            item.add_marker(pytest.mark.skip(reason=f"needs CUDA's tools: {tools_reason}"))
