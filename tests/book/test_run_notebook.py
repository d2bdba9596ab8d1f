"""``tools/run_notebook.py`` re-executes a chapter the way its committed outputs are made:
a cell tagged ``gpu`` keeps its output where there is no GPU, and a cell tagged ``nvcc`` where
``nvcc`` or ``cuobjdump`` is missing, while every other cell runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("run_notebook", ROOT / "tools/run_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cell(source, tags, committed):
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": tags})
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=committed)]
    return cell


def test_tagged_cells_keep_their_outputs_where_what_they_need_is_missing(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        _cell('print("ran")', [], "committed\n"),
        _cell('print("ran")', ["gpu"], "from the GPU run\n"),
        _cell('print("ran")', ["nvcc", "nbval-ignore-output"], "from the nvcc run\n"),
    ]
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nb, path)
    _tool().run(path, gpu=False, tools=False)
    got = [c.outputs[0]["text"] for c in nbformat.read(path, as_version=4).cells]
    assert got == ["ran\n", "from the GPU run\n", "from the nvcc run\n"]
    _tool().run(path, gpu=True, tools=True)
    got = [c.outputs[0]["text"] for c in nbformat.read(path, as_version=4).cells]
    assert got == ["ran\n", "ran\n", "ran\n"]
