"""Every recorded measurement says which kernels it measured, and still describes them.

A results file records ``meta.commit`` and ``meta.sources``: the source hash
(``flashref.bench.provenance.source_hash``, includes pasted in) of each kernel version it
measured. This test recomputes the hashes from the tree: a file that names a version whose
source has changed since fails, with the command that re-records it; a change of the text
alone, whose PTX the snapshot showed the same (``provenance.SAME_PTX``), is not a change of the
kernel. Files recorded before
the hashes existed are listed by name in ``RECORDED_BEFORE_HASHES``; the list only shrinks (a
listed file that now has hashes fails until it is taken off), and a new file without hashes
fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flashref.bench import provenance

RESULTS = Path(__file__).resolve().parents[2] / "results"

# recorded before results files carried source hashes: re-record one to take it off
RECORDED_BEFORE_HASHES = frozenset(
    {
        "gpu_bench.json",
        "gpu_cold.json",
        "gpu_decode.json",
        "gpu_decode_profile.json",
        "gpu_decode_profile_v7.json",
        "gpu_decode_splits.json",
        "gpu_decode_splits_d64.json",
        "gpu_hopper.json",
        "gpu_hopper_profile.json",
        "gpu_io.json",
        "gpu_profile.json",
        "gpu_stall_sampling.json",
        "gpu_stall_sampling_v27.json",
        "gpu_stall_sampling_v29.json",
    }
)

FILES = sorted(p.name for p in RESULTS.glob("*.json"))


def _meta(name: str) -> dict:
    data = json.loads((RESULTS / name).read_text())
    return data.get("meta", {}) if isinstance(data, dict) else {}


@pytest.mark.parametrize("name", FILES)
def test_a_results_file_still_describes_the_kernels_it_measured(name):
    meta = _meta(name)
    if name in RECORDED_BEFORE_HASHES:
        assert "sources" not in meta, (
            f"results/{name} now records source hashes: take it off RECORDED_BEFORE_HASHES"
        )
        return
    assert "sources" in meta and "commit" in meta, (
        f"results/{name} records no commit and source hashes (meta.commit, meta.sources): "
        "write its meta with flashref.bench.provenance.tree()"
    )
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|unknown", meta["commit"]), meta["commit"]
    # a study of a kernel that is not a numbered version (the prefill's stamps) names it
    # under other_sources alone; every file names some kernel
    assert meta["sources"] or meta.get("other_sources"), f"results/{name} names no kernel"
    now = provenance.current_hashes()
    stale = {
        v: (h, now.get(v))
        for v, h in meta["sources"].items()
        if not provenance.describes(v, h, now.get(v))
    }
    assert not stale, (
        f"results/{name} measured kernels whose sources changed since (version: recorded "
        f"hash, the tree's): {stale}; re-record it"
    )


def test_the_hash_covers_the_included_headers(tmp_path, monkeypatch):
    from flashref.gpu import registry

    (tmp_path / "k.cu").write_text('#include "h.cuh"\nkernel\n')
    (tmp_path / "h.cuh").write_text("one\n")
    before = provenance.source_hash(registry.paste_includes(tmp_path / "k.cu"))
    (tmp_path / "h.cuh").write_text("two\n")
    after = provenance.source_hash(registry.paste_includes(tmp_path / "k.cu"))
    assert before != after and len(before) == 16


def test_every_registered_version_has_a_hash_and_tree_picks_the_measured_ones(monkeypatch):
    from flashref.gpu.backward_versions import BWD_VERSIONS
    from flashref.gpu.decode.versions import VERSIONS as DECODE
    from flashref.gpu.forward_versions import VERSIONS

    hashes = provenance.current_hashes()
    want = (
        {f"forward/{n}" for n in VERSIONS}
        | {f"backward/{n}" for n in BWD_VERSIONS}
        | {f"decode/{n}" for n in DECODE}
    )
    assert set(hashes) == want
    monkeypatch.setenv("FLASHREF_COMMIT", "0" * 40)
    t = provenance.tree(forward=[29], backward="all", decode=[7])
    assert t["commit"] == "0" * 40
    assert set(t["sources"]) == {"forward/29", "decode/7"} | {f"backward/{n}" for n in BWD_VERSIONS}


@pytest.mark.parametrize("name", [n for n in FILES if "other_sources" in _meta(n)])
def test_a_file_still_describes_its_unnumbered_kernels(name):
    """A file that measured kernels that are not numbered versions (``bench serving``: the
    cache's and the prefill's) records their hashes as ``meta.other_sources``, by path under
    ``flashref/kernels/`` (where it was then: ``provenance.MOVED`` says where it is now; a
    text-only change is carried by ``provenance.SAME_PTX``, keyed by the path now)."""
    from flashref.gpu.registry import KERNEL_DIR, paste_includes

    for path, h in _meta(name)["other_sources"].items():
        where = provenance.MOVED.get(path, path)
        now = provenance.source_hash(paste_includes(KERNEL_DIR / where))
        assert provenance.describes(where, h, now), f"results/{name} measured another {path}"


def test_a_text_only_change_carries_a_recorded_hash_to_the_new_one(monkeypatch):
    monkeypatch.setattr(provenance, "SAME_PTX", {"decode/7": {"a": "b", "b": "c", "x": "x"}})
    assert provenance.describes("decode/7", "a", "c") and provenance.describes("decode/7", "c", "c")
    assert not provenance.describes("decode/7", "a", "d")  # then a real change
    assert not provenance.describes("decode/6", "a", "c")  # another version's change
    assert not provenance.describes("decode/7", "x", "y")  # a loop ends


def test_an_include_with_a_folder_resolves_under_kernels(tmp_path):
    """``#include "hopper/x.cuh"`` names another family's header where it is (the chunked
    prefill in decode/ takes the Hopper forward's loop pieces); a bare name resolves in the
    file's folder, then common/, and nowhere else."""
    from flashref.gpu import registry

    hopper = registry.KERNEL_DIR / "hopper"
    text = registry.paste_includes(registry.KERNEL_DIR / "decode" / "paged_prefill.cu")
    for name in ("consumer_loop.cuh", "tile_scheduler.cuh", "hopper_common.cuh"):
        where = hopper if name != "hopper_common.cuh" else registry.COMMON_DIR
        assert (where / name).read_text() in text, name
    assert registry.find_include("hopper/v29_lean_loop.cu", tmp_path) == hopper / "v29_lean_loop.cu"
    with pytest.raises(FileNotFoundError, match="consumer_loop.cuh"):
        registry.find_include("consumer_loop.cuh", registry.KERNEL_DIR / "decode")
    with pytest.raises(FileNotFoundError, match="hopper/none.cuh"):
        registry.find_include("hopper/none.cuh", tmp_path)
