"""Every GPU entry point's host path on a CPU, through the CuPy stand-in (``cupy_standin``).

The stand-in records launches instead of running them, so these tests check what the host
path decides: that each entry point reaches its kernels (the planned route and the general
one), with the grid, shared memory and arguments its plan made, and that a block table goes
from the call to the launch through at most ``MOST`` stays in flashref's modules
(``call_path``). Skipped where CuPy itself is installed (the GPU tests run the real calls).
"""

from __future__ import annotations

import importlib.util

import cupy_standin as S
import numpy as np
import pytest
from call_path import module_stays

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("cupy") is not None, reason="CuPy is installed: the GPU tests run"
)

MOST = 6


@pytest.fixture
def standin():
    with S.installed() as log:
        yield log


def _arr(rng, *shape, dtype=np.float16):
    return S.asarray(rng.standard_normal(shape).astype(dtype))


def _kernels(log):
    return [(e[0], e[1]) for e in log if e[0] in ("cupy", "driver")]


def test_forward_and_backward_launch_what_their_plans_say(standin):
    import flashref.gpu as fg

    rng = np.random.default_rng(0)
    q, k, v = (_arr(rng, 2, 4, 300, 64) for _ in range(3))
    O, lse = fg.flash_attention(q, k, v, causal=True, version=29, return_lse=True)
    assert _kernels(standin) == [("driver", "flash_v29")]  # planned: the driver's launch
    ver = fg.VERSIONS[29]
    grid, block, smem, args = standin[-1][2:]
    want_grid = (*ver.grid(300, 8, 132), 1, 1)[:3]  # the stand-in's 132 SMs
    assert (grid, block, smem) == (want_grid, (ver.threads, 1, 1), ver.smem_bytes(64))
    assert args[:5] == [q.data.ptr, k.data.ptr, v.data.ptr, O.data.ptr, lse.data.ptr]
    standin.clear()
    fg.flash_attention(q[:, :, ::2], k, v, version=29)  # strided q: copied, the general route
    assert _kernels(standin) == [("cupy", "flash_v29")]
    standin.clear()
    do = _arr(rng, *q.shape)
    fg.flash_attention_backward(q, k, v, O, lse, do, causal=True, version=8)
    kinds = [e[0] for e in standin if e[0] != "compile"]
    assert kinds == ["driver", "memset", "driver", "driver"], kinds  # pre, dQacc = 0, main, dQ


@pytest.mark.parametrize("where", ["device", "host"])
@pytest.mark.parametrize("version", [None, 3])
def test_the_block_table_passes_through_few_modules(standin, where, version):
    from flashref.gpu import paged_decode_attention

    rng = np.random.default_rng(0)
    q, kp = _arr(rng, 2, 8, 1, 64), _arr(rng, 8, 2, 64, 64)
    table = np.arange(8, dtype=np.int32).reshape(2, 4)
    lengths = np.array([256, 219], np.int32)
    if where == "device":
        table, lengths = S.asarray(table), S.asarray(lengths)

    def call():
        paged_decode_attention(q, kp, kp, table, lengths, version=version)

    call()  # the signature's first call makes its plan
    standin.clear()
    stays, launched = module_stays(call, table)
    assert launched and _kernels(standin), f"no launch: {stays}"
    assert len(stays) <= MOST, f"{where} table: {len(stays)} stays: {' -> '.join(stays)}"


def test_every_decode_entry_point_launches(standin):
    import flashref.gpu as fg
    from flashref.gpu.decode import DevicePagedKVCache, PagedDecodePlan

    rng = np.random.default_rng(1)
    B, Hq, Hkv, d = 3, 8, 2, 128
    q = _arr(rng, B, Hq, 1, d)
    kc, vc = _arr(rng, B, Hkv, 700, d), _arr(rng, B, Hkv, 700, d)
    kp, vp = _arr(rng, 40, Hkv, 64, d), _arr(rng, 40, Hkv, 64, d)
    table = np.arange(B * 12, dtype=np.int32).reshape(B, 12) % 40
    lengths = np.array([700, 64, 1], np.int32)
    calls = {
        "contiguous": lambda: fg.decode_attention(q, kc, vc, lengths=S.asarray(lengths)),
        "contiguous, v4": lambda: fg.decode_attention(q, kc, vc, num_splits=4, version=4),
        "paged, host tables": lambda: fg.paged_decode_attention(q, kp, vp, table, lengths),
        "paged, device": lambda: fg.paged_decode_attention(
            q, kp, vp, S.asarray(table), S.asarray(lengths), version=6
        ),
        "prefill": lambda: fg.paged_prefill_attention(
            _arr(rng, B, Hq, 64, d), kp, vp, table, lengths.clip(64, None), splits=3
        ),
    }
    want = {
        "contiguous": [("driver", "decode_split_kv_v7"), ("driver", "decode_combine_v3")],
        "contiguous, v4": [("cupy", "decode_split_kv_v4")],  # counts arrivals: general route
        "paged, host tables": [("cupy", "decode_split_kv_v7"), ("cupy", "decode_combine_v3")],
        "paged, device": [("driver", "decode_split_kv_v6"), ("driver", "decode_combine_v3")],
        "prefill": [("driver", "paged_prefill"), ("driver", "paged_prefill_combine")],
    }
    for name, call in calls.items():
        standin.clear()
        call()
        assert _kernels(standin) == want[name], f"{name}: {_kernels(standin)}"
    plan = PagedDecodePlan(q, kp, vp, S.asarray(table), S.asarray(lengths))
    standin.clear()
    assert plan.run(q, kp, vp) is plan.out
    assert [k[1] for k in _kernels(standin)][0] == "decode_split_kv_v7"
    cache = DevicePagedKVCache(16, 64, Hkv, d, max_batch=2, library="cupy")
    seqs = [cache.new_sequence() for _ in range(2)]
    standin.clear()
    cache.begin_step(seqs, 3)
    cache.append(0, _arr(rng, 2, Hkv, 3, d), _arr(rng, 2, Hkv, 3, d))
    assert _kernels(standin) == [("driver", "paged_slots"), ("driver", "paged_append")]
