"""Execute chapter notebooks in place, the way their committed outputs are made.

    python tools/run_notebook.py notebooks/04_tiled_flashattention.ipynb [more.ipynb ...]

Each notebook runs top to bottom in a fresh kernel started in ``notebooks/``. Cells tagged
``gpu`` run only where ``flashref.gpu.available()``, and cells tagged ``nvcc`` only where
``nvcc`` and ``cuobjdump`` are on the PATH; elsewhere they keep their committed outputs,
which come from a run where they were. A cell's consecutive prints become one output (a
cell that prints while it compiles would otherwise show as many boxes). Execution counts
are renumbered from 1 and the
notebook's metadata is reduced to the kernel's name, so that a re-run changes the file only
where an output changed. ``make test`` then checks the result with nbval.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


TOOLS = ("nvcc", "cuobjdump")  # what a cell tagged nvcc runs


def run(path: Path, gpu: bool, tools: bool) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=900,
        kernel_name="python3",
        coalesce_streams=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    count = 0
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            count += 1
            tags = cell.metadata.get("tags", [])
            if ("gpu" in tags and not gpu) or ("nvcc" in tags and not tools):
                cell.execution_count = count  # outputs from the run that had them stay
                continue
            client.execute_cell(cell, index)
            cell.execution_count = count
            cell.metadata.pop("execution", None)
    nb.metadata = METADATA
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import flashref.gpu

    gpu = flashref.gpu.available()
    tools = all(shutil.which(t) for t in TOOLS)
    print(f"GPU cells: {'run' if gpu else 'kept as committed (no GPU here)'}")
    print(f"nvcc cells: {'run' if tools else 'kept as committed (no nvcc or cuobjdump here)'}")
    for name in argv:
        run(Path(name), gpu, tools)
        print(f"executed {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
