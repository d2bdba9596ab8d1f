"""The PTX snapshot (python -m flashref.bench.ptx_snapshot) lists every build of every family
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
        want = sum(len([d for d in (64, 128) if d in v.head_dims]) + (dt == "float32")
                   for dt in v.dtypes)  # fmt: skip
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
