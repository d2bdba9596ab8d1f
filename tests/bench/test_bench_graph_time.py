"""The decode bench's graph timing without a GPU: how many input copies and calls a graph
gets, and how the table shows the replayed rows."""

from __future__ import annotations

import pytest

from flashref.bench import decode as bench
from flashref.bench.timing import graph_time as gt

L2 = 50 * 2**20  # the H200's L2: 50 MiB
MB = 2**20


@pytest.mark.parametrize(
    ("kv_bytes", "sets"),
    [(16 * MB, 8), (64 * MB, 3), (150 * MB, 1), (160 * MB, 1), (2**36, 1), (1, 8)],
)
def test_input_sets_overflow_the_l2(kv_bytes, sets):
    n = gt.input_sets(kv_bytes, L2)
    assert n == sets
    assert n == gt.MAX_SETS or n * kv_bytes >= gt.L2_MULTIPLE * L2  # rotated: out of the L2
    assert n == 1 or (n - 1) * kv_bytes < gt.L2_MULTIPLE * L2  # the fewest that do


@pytest.mark.parametrize("kv_bytes", [0, -5])
def test_input_sets_refuse_no_bytes(kv_bytes):
    with pytest.raises(ValueError, match="kv_bytes must be positive"):
        gt.input_sets(kv_bytes, L2)


@pytest.mark.parametrize("kv_bytes", [16 * MB, 64 * MB, 150 * MB, 2**30, 2**33, 2**36])
def test_graph_calls_are_whole_passes_over_the_sets(kv_bytes):
    sets = gt.input_sets(kv_bytes, L2)
    calls = gt.graph_calls(kv_bytes, sets)
    assert calls % sets == 0
    assert gt.MIN_CALLS <= calls < gt.MAX_CALLS + sets
    # enough bytes per replay, unless the call limit stops it first
    assert calls * kv_bytes >= gt.MIN_GRAPH_BYTES or calls >= gt.MAX_CALLS


def test_table_shows_the_graph_rows(capsys):
    meta = {"gpu": "G", "hbm_read_gbps": 4000.0, "hbm_copy_gbps": 3000.0, "sm_count": 132}
    base = {
        "dtype": "float16",
        "d": 128,
        "B": 1,
        "Hq": 32,
        "Hkv": 8,
        "Nq": 1,
        "Nk": 4096,
        "num_splits": None,
        "note": None,
        "ratio_to_cudnn": 1.0,
        "fraction_of_read": 0.2,
        "host_us": None,
        "kernel_us": None,
        "gbps": 800.0,
    }
    rows = [
        {
            **base,
            "impl": "flashref_v6",
            "graph_gbps": 2100.0,
            "graph_ratio_to_cudnn": 1.05,
            "graph_fraction_of_read": 0.525,
        },
        {**base, "impl": "flashref_paged_v6", "graph_gbps": None},
        {
            **base,
            "impl": "sdpa_cudnn",
            "graph_gbps": 2000.0,
            "graph_ratio_to_cudnn": 1.0,
            "graph_fraction_of_read": 0.5,
        },
        {**base, "impl": "sdpa_flash", "graph_gbps": None, "graph_note": "RuntimeError: no"},
    ]
    bench.print_table({"meta": meta, "rows": rows})
    out = capsys.readouterr().out
    graph = out[out.index("# replayed from a CUDA graph") :]
    header = graph.splitlines()[1]
    assert "flashref_v6" in header and "sdpa_cudnn" in header
    assert "paged" not in header and "sdpa_flash" not in header  # no replayed figure
    assert "2100 (1.05, 0.53)" in graph and "2000 (1.00, 0.50)" in graph
    assert "graph sdpa_flash float16 B=1 Hkv=8 Nk=4096: RuntimeError: no" in graph


class _Tensor:
    def __init__(self, shape, tag):
        self.shape, self.tag = tuple(shape), tag

    def repeat_interleave(self, n, dim):
        shape = list(self.shape)
        shape[dim] *= n
        return _Tensor(shape, f"{self.tag}x{n}")


def _fake_torch(monkeypatch, calls):
    """Modules ``torch`` and ``torch.nn.attention`` that record what SDPA is called with."""
    import sys
    import types
    from contextlib import contextmanager

    torch = types.ModuleType("torch")
    attention = types.ModuleType("torch.nn.attention")
    torch.from_dlpack = lambda x: _Tensor(x.shape, x.tag)
    attention.SDPBackend = types.SimpleNamespace(CUDNN_ATTENTION="cudnn", MATH="math")

    @contextmanager
    def sdpa_kernel(be):
        calls.append(("backend", be))
        yield

    def sdpa(q, k, v, enable_gqa):
        calls.append(("sdpa", q.shape, k.shape, k.tag, v.tag, enable_gqa))
        return "O"

    attention.sdpa_kernel = sdpa_kernel
    torch.nn = types.SimpleNamespace(
        functional=types.SimpleNamespace(scaled_dot_product_attention=sdpa), attention=attention
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.nn", torch.nn)
    monkeypatch.setitem(sys.modules, "torch.nn.attention", attention)


@pytest.mark.parametrize(
    ("how", "k_shape", "k_tag", "gqa"),
    [
        ("enable_gqa", (2, 8, 64, 16), "k", True),
        ("plain", (2, 8, 64, 16), "k", False),
        ("repeated", (2, 32, 64, 16), "kx4", False),
    ],
)
def test_sdpa_decode_calls_the_backend_with_the_grouping(monkeypatch, how, k_shape, k_tag, gqa):
    from types import SimpleNamespace

    calls = []
    _fake_torch(monkeypatch, calls)
    q, k, v = (
        SimpleNamespace(shape=s, tag=t)
        for s, t in (((2, 32, 1, 16), "q"), ((2, 8, 64, 16), "k"), ((2, 8, 64, 16), "v"))
    )
    run = bench.sdpa_decode(q, k, v, backend="CUDNN_ATTENTION", how=how)
    assert calls == []  # made, not yet called: the repeat (if any) is done, outside the call
    assert run() == "O" and run() == "O"
    assert calls[0] == ("backend", "cudnn")
    assert calls[1] == ("sdpa", (2, 32, 1, 16), k_shape, k_tag, k_tag.replace("k", "v"), gqa)
    assert calls[2:] == calls[:2]  # each call the same, nothing repeated again
