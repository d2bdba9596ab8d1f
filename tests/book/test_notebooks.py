"""The committed chapter notebooks: quiet JSON, and outputs that every machine prints.

nbval re-executes every chapter and compares each output with the committed one, once
under the default BLAS (``make notebooks``) and once under another
(``make notebooks-other-blas``). The checks here need no kernel and run in milliseconds:
they catch, before any execution, the two ways a committed notebook most often stops
being what a reader's machine prints.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9]*.ipynb"))
QUIET_METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}
# A number such as 4.4e-16 or 1.1e-13: the size of float64 rounding, whose digits change
# with the CPU, its BLAS kernel and the thread count.
ROUNDING_LEVEL = re.compile(r"\b\d\.\d+e-1\d\b")


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _output_text(output: dict) -> str:
    if output["output_type"] == "stream":
        text = output["text"]
    else:
        text = output.get("data", {}).get("text/plain", "")
    return text if isinstance(text, str) else "".join(text)


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_metadata_is_quiet(path):
    # No kernel names of one machine, no execution timestamps: reviewers diff the JSON.
    nb = _load(path)
    assert nb["metadata"] == QUIET_METADATA
    for i, cell in enumerate(nb["cells"]):
        extra = set(cell["metadata"]) - {"tags", "mystnb"}
        assert not extra, f"cell {i} has metadata {sorted(extra)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_run_top_to_bottom_in_one_fresh_kernel(path):
    counts = [c["execution_count"] for c in _load(path)["cells"] if c["cell_type"] == "code"]
    assert counts == list(range(1, len(counts) + 1))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_float64_rounding_digits_in_compared_outputs(path):
    # Such a number belongs in a cell tagged nbval-ignore-output, next to a statement
    # that holds on every machine ("max error <= 8 * eps: True").
    found = []
    for i, cell in enumerate(_load(path)["cells"]):
        if cell["cell_type"] != "code":
            continue
        if "nbval-ignore-output" in cell["metadata"].get("tags", []):
            continue
        for output in cell.get("outputs", []):
            found += [f"cell {i}: {m}" for m in ROUNDING_LEVEL.findall(_output_text(output))]
    assert not found, found
