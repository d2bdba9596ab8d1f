"""Decode version 4 without a GPU: its plan, its split limit, and its arrival counters.

Version 4 is version 3 in one launch (the last split block of each row block merges), so its
plan and shared memory are version 3's and there is no combine kernel. Its counters
(``flashref.gpu.decode.buffers``) are checked here with a stand-in for CuPy whose arrays are
NumPy's: one zeroed buffer per (device, stream, size class), dropped when a launch raises.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

import flashref.gpu as fg
from flashref.gpu import decode as dec
from flashref.gpu.decode import buffers as dc


def test_version_4_is_version_3_in_one_launch():
    v4 = dec.VERSIONS[4]
    assert (v4.file, v4.split_kernel, v4.combine_kernel) == (
        "v04_last_block_merge.cu",
        "decode_split_kv_v4",
        None,
    )
    text3, text4 = dec.source(3), dec.source(4)
    assert text3 in text4 and not re.search(r"^#include", text4, re.M)  # nested ones too
    assert text4.count("decode_split_kv_v4(") == 1
    # one split body: version 2 waits, then refills; version 4 refills, then waits
    assert "split_kv_v2_body<false>(" in dec.source(2) and "split_kv_v2_body<true>(" not in text3
    assert text4.count("split_kv_v2_body<true>(") == 1
    for shape in (
        (1, 32, 8, 1, 32768, 128, 132),
        (8, 8, 1, 16, 4096, 64, 132),
        (32, 32, 8, 1, 131072, 128, 132),
    ):
        p3, p4 = fg.decode_plan(*shape, version=3), fg.decode_plan(*shape, version=4)
        assert p4.version == 4 and (p3.grid, p3.threads, p3.smem_bytes, p3.num_splits) == (
            p4.grid,
            p4.threads,
            p4.smem_bytes,
            p4.num_splits,
        )


def test_version_4_refuses_more_splits_than_its_merge_holds(no_cupy):
    q = np.zeros((2, 8, 1, 64), np.float16)
    k = np.zeros((2, 2, 100, 64), np.float16)
    match = r"num_splits is 129; decode version 4 merges at most 128 splits"
    with pytest.raises(ValueError, match=match):
        fg.decode_attention(q, k, k, num_splits=129, version=4)
    with pytest.raises(ValueError, match=match):
        dec.decode_plan(1, 8, 2, 1, 100, 64, 132, num_splits=129, version=4)
    assert dec.decode_plan(1, 8, 2, 1, 100, 64, 132, num_splits=128, version=4).num_splits == 128
    with pytest.raises(fg.GPUUnavailableError):  # 128 passes the check and reaches the GPU's
        fg.decode_attention(q, k, k, num_splits=128, version=4)


@pytest.mark.parametrize("n,size", [(1, 1024), (1024, 1024), (1025, 2048), (5000, 8192)])
def test_size_class(n, size):
    assert dc.counter_size_class(n) == size


@pytest.mark.parametrize("n", [0, -3, 2.0, True, None])
def test_size_class_refuses_a_bad_count(n):
    with pytest.raises(ValueError, match=r"n must be a positive int \(row blocks to count\)"):
        dc.counter_size_class(n)


def _fake_cp(device=0, stream=7):
    """The parts of CuPy the counters use: the current device and stream, zeros."""
    made = []

    def zeros(n, dtype):
        made.append(np.zeros(n, dtype))
        return made[-1]

    cuda = SimpleNamespace(
        Device=lambda: SimpleNamespace(id=device),
        get_current_stream=lambda: SimpleNamespace(ptr=stream),
    )
    return SimpleNamespace(cuda=cuda, zeros=zeros, uint32=np.uint32), made


@pytest.fixture
def no_buffers(monkeypatch):
    monkeypatch.setattr(dc, "_counters", {})


def test_one_zeroed_buffer_per_device_stream_and_class(no_buffers):
    cp, made = _fake_cp()
    a = dc.counter_buffer(cp, 10)
    assert a.dtype == np.uint32 and a.shape == (1024,) and not a.any()
    assert dc.counter_buffer(cp, 1000) is a and len(made) == 1  # one class: reused
    assert dc.counter_buffer(cp, 2000) is not a  # the next class
    other_stream, _ = _fake_cp(stream=8)
    other_device, _ = _fake_cp(device=1)
    assert dc.counter_buffer(other_stream, 10) is not a
    assert dc.counter_buffer(other_device, 10) is not a
    assert dc.counter_buffer(cp, 10) is a


def test_a_launch_that_raises_drops_its_buffer(no_buffers):
    cp, _ = _fake_cp()
    with dc.counting(cp, 10) as counters:
        pass  # a launch that ran: the kernel left every counter at 0
    assert dc.counter_buffer(cp, 10) is counters
    with pytest.raises(RuntimeError, match="launch failed"):
        with dc.counting(cp, 10) as counters:
            counters[3] = 2  # as if two blocks had counted in before the failure
            raise RuntimeError("launch failed")
    fresh = dc.counter_buffer(cp, 10)
    assert fresh is not counters and not fresh.any()
