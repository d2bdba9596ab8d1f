"""The PTX snapshot (python -m flashref.bench ptx_snapshot) lists every build of every family
and names each build whose PTX changed. Without nvcc: the list and the comparison only."""

from __future__ import annotations

import re

from flashref.bench import ptx_snapshot as ps
from flashref.gpu import BWD_VERSIONS, VERSIONS
from flashref.gpu.decode import VERSIONS as DECODE_VERSIONS


def test_every_version_of_every_family_is_built():
    labels = [label for label, _, _ in ps.builds()]
    assert len(labels) == len(set(labels))
    for n, v in VERSIONS.items():
        want = sum(
            len([d for d in (64, 128) if d in v.head_dims]) + (dt == "float32") for dt in v.dtypes
        )
        assert sum(label.startswith(f"fwd{n:02d}_") for label in labels) == want, n
    for n, v in BWD_VERSIONS.items():  # both dtypes at each head dim the version takes
        want = 2 * len([d for d in (64, 128) if d in v.head_dims])
        assert sum(label.startswith(f"bwd{n:02d}_") for label in labels) == want, n
    for n in DECODE_VERSIONS:  # d 64 and 128, 16 and 32 rows, fp16 and bf16
        assert sum(label.startswith(f"dec{n:02d}_") for label in labels) == 8, n
    assert {"probe_probe_wgmma", "probe_roof_wgmma", "probe_probe_fragments"} <= set(labels)
    prefill = {f"paged_prefill_d{d}_{dt}" for d in (64, 128) for dt in ("float16", "bfloat16")}
    assert prefill | {"paged_cache"} <= set(labels)  # the serving kernels beside the versions
    for label, text, flags in ps.builds():
        assert not re.search(r"^#include", text, re.M), label  # NVRTC's text: headers pasted in
        assert flags[0].startswith("-arch=sm_90"), label


def test_compare_names_what_changed():
    before = {"ptx_sha256": {"a": "1", "b": "2", "c": "3"}}
    after = {"ptx_sha256": {"a": "1", "b": "9", "d": "4"}}
    assert ps.compare(before, after) == ["differs: b", "only before: c", "only after: d"]
    assert ps.compare(before, before) == []


def _kernel(name: str, body: str) -> str:
    return f"\t// .globl\t{name}\n.visible .entry {name}(\n)\n" + "{\n" + body + "\n}\n"


def test_entries_compares_function_by_function(tmp_path):
    """A module that lost a kernel and holds the other in another place: the same functions,
    once the numbers nvcc gives by a function's place ($L__BB<i>_, __local_depot<i>) are set
    aside; a changed instruction still differs."""
    head = "//\n.version 9.0\n.target sm_90a\n\n"
    k0 = _kernel("k0", "\tbra.uni \t$L__BB0_1;\n$L__BB0_1:\n\tret;")
    k1 = "\t.local .align 4 .b8 \t__local_depot{i}[4];\n"
    k1 += "\tbra.uni \t$L__BB{i}_1;\n$L__BB{i}_1:\n\tret;"
    before = head + k0 + _kernel("k1", k1.format(i=1))
    after = head + _kernel("k1", k1.format(i=0))
    assert ps.entries(before)["k1"] == ps.entries(after)["k1"] != ps.entries(before)["k0"]
    assert list(ps.entries(before)) == ["k0", "k1"] and list(ps.entries(after)) == ["k1"]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    (tmp_path / "a" / "m.ptx").write_text(before)
    (tmp_path / "b" / "m.ptx").write_text(after)
    assert ps.compare_entries(tmp_path / "a", tmp_path / "b", ["m"]) == (
        [],
        ["same functions: m (1; only before: k0)"],
    )
    (tmp_path / "b" / "m.ptx").write_text(after.replace("\tret;", "\ttrap;"))
    assert ps.compare_entries(tmp_path / "a", tmp_path / "b", ["m"])[0] == ["differs: m: k1"]
