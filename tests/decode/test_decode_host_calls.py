"""The decode launch's host shortcuts on the GPU: each gives exactly what the long way gives.

The partials' workspace (``flashref.gpu.decode.buffers``) is shared by calls on one stream:
a call after other shapes and split counts have used it gives the same bits as a call on a
fresh buffer, and an earlier call's ``O``/``lse`` are never touched by a later call. Inputs
already contiguous and aligned are passed as they are, others copied; a tensor map is kept per
exact (address, shape, strides, dtype, box, device).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _inputs(cp, B, Hq, Hkv, Nk, d, seed):
    rng = cp.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, 1, d), dtype=cp.float32).astype(cp.float16)
    k, v = (
        rng.standard_normal((B, Hkv, Nk, d), dtype=cp.float32).astype(cp.float16) for _ in range(2)
    )
    return q, k, v


def _first_difference(a, b) -> str:
    bad = np.flatnonzero(a.view(np.uint16).ravel() != b.view(np.uint16).ravel())
    if not bad.size:
        return "none"
    i = np.unravel_index(bad[0], a.shape)
    return f"{bad.size} elements differ, first at {i}: {a[i]!r} vs {b[i]!r}"


def _versions(cp):
    cc = divmod(int(cp.cuda.Device().compute_capability), 10)
    return [1, 2, 3, 4] + ([5, 6] if tuple(cc) == (9, 0) else [])


def test_a_reused_workspace_gives_the_bits_of_a_fresh_one(cp, monkeypatch):
    from flashref.gpu import decode_attention
    from flashref.gpu.decode import buffers as decode_buffers

    cases = [
        (2, 8, 2, 1000, 128, 6),
        (1, 32, 8, 4096, 128, 16),
        (3, 4, 4, 700, 64, 3),
        (1, 4, 1, 5000, 64, 64),
        (2, 8, 2, 1000, 128, 1),
    ]
    for version in _versions(cp):
        fresh = {}
        for seed, case in enumerate(cases):  # each call alone, on a new buffer
            monkeypatch.setattr(decode_buffers, "_partials", {})
            q, k, v = _inputs(cp, *case[:5], seed=seed)
            O, lse = decode_attention(q, k, v, num_splits=case[5], return_lse=True, version=version)
            fresh[case] = (cp.asnumpy(O), cp.asnumpy(lse))
        monkeypatch.setattr(decode_buffers, "_partials", {})
        kept = []
        for rnd in range(2):  # every call on the buffer the calls before it used
            for seed, case in enumerate(cases):
                q, k, v = _inputs(cp, *case[:5], seed=seed)
                O, lse = decode_attention(
                    q, k, v, num_splits=case[5], return_lse=True, version=version
                )
                kept.append((case, O, lse))
                want_O, want_lse = fresh[case]
                label = f"v{version} round {rnd} B,Hq,Hkv,Nk,d,S={case}"
                got = cp.asnumpy(O)
                diff = _first_difference(got, want_O)
                assert got.tobytes() == want_O.tobytes(), f"{label}: O: {diff}"
                assert cp.asnumpy(lse).tobytes() == want_lse.tobytes(), f"{label}: lse differs"
        for case, O, lse in kept:  # later calls never wrote into an earlier call's O, lse
            assert cp.asnumpy(O).tobytes() == fresh[case][0].tobytes(), f"v{version} {case}: O"
            assert cp.asnumpy(lse).tobytes() == fresh[case][1].tobytes(), f"v{version} {case}"
        assert len(decode_buffers._partials) <= 3, decode_buffers._partials.keys()


def test_kernel_inputs_pass_as_they_are_or_are_copied(cp):
    from flashref.gpu._launch import as_kernel_input

    x = cp.arange(4 * 8 * 64, dtype=cp.float16).reshape(4, 8, 64)
    assert as_kernel_input(x, x.shape) is x
    y = as_kernel_input(x, (32, 64))
    assert y.data.ptr == x.data.ptr and y.shape == (32, 64)
    odd = x.ravel()[1 : 1 + 4 * 8 * 63].reshape(4, 8, 63)  # 2 bytes past an aligned start
    assert odd.data.ptr % 16 == 2
    z = as_kernel_input(odd, odd.shape)
    assert z.data.ptr % 16 == 0 and bool((z == odd).all())
    t = as_kernel_input(x.transpose(1, 0, 2), (8, 4, 64))  # not contiguous: a copy
    assert t.flags.c_contiguous and bool((t == x.transpose(1, 0, 2)).all())


def test_tensor_maps_are_kept_per_exact_array(cp):
    cc = divmod(int(cp.cuda.Device().compute_capability), 10)
    if tuple(cc) != (9, 0):
        pytest.skip(f"tensor maps are made for sm_90a (compute capability 9.0), this GPU has {cc}")
    from flashref.gpu._launch import tensor_map_of, tensor_map_ptr

    a = cp.zeros((256, 64), dtype=cp.float16)
    b = cp.zeros((256, 64), dtype=cp.float16)
    dev = cp.cuda.runtime.getDevice()

    def m(x, box):
        return tensor_map_ptr(x.data.ptr, *x.shape, "float16", box, dev)

    assert m(a, 64) is m(a, 64)  # kept
    assert m(a, 64) != m(b, 64)  # another address
    assert m(a, 64) != m(a, 128)  # another box
    assert m(a[:128], 64) != m(a, 64)  # another shape
    assert tensor_map_of(a, 64).tobytes() == m(a, 64)  # what a CuPy launch is given


def test_tensor_maps_encoded_through_ctypes_equal_cuda_bindings(cp):
    """``_driver.encode_tensor_map`` gives the bytes ``cuda.bindings``' own
    ``cuTensorMapEncodeTiled`` gives for the same array, box, swizzle and fill."""
    cc = divmod(int(cp.cuda.Device().compute_capability), 10)
    if tuple(cc) != (9, 0):
        pytest.skip(f"tensor maps are made for sm_90a (compute capability 9.0), this GPU has {cc}")
    import ctypes

    from cuda.bindings import driver

    from flashref.gpu._driver import encode_tensor_map

    types = {
        "float16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        "bfloat16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    }
    x = cp.empty((3000, 128), dtype=cp.float16)
    for dtype, rows, cols, box in (
        ("float16", 3000, 128, 64),
        ("bfloat16", 1000, 64, 128),
        ("float16", 17, 64, 32),
    ):
        err, tmap = driver.cuTensorMapEncodeTiled(
            types[dtype],
            2,
            x.data.ptr,
            [driver.cuuint64_t(cols), driver.cuuint64_t(rows)],
            [driver.cuuint64_t(cols * 2)],
            [driver.cuuint32_t(64), driver.cuuint32_t(box)],
            [driver.cuuint32_t(1), driver.cuuint32_t(1)],
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        assert err == driver.CUresult.CUDA_SUCCESS
        want = ctypes.string_at(tmap.getPtr(), 128)
        got = encode_tensor_map(x.data.ptr, rows, cols, cols * 2, dtype, box)
        assert got == want, (dtype, rows, cols, box)
