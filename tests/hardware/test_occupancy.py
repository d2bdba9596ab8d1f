"""flashref.hardware.occupancy: the warps an SM holds, from its budgets (made-up kernels)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flashref.hardware import occupancy as oc


def test_resident_warps_takes_the_tightest_budget():
    device = {
        "smem_per_sm_bytes": 228 * 1024,
        "smem_per_block_optin_bytes": 227 * 1024,
        "registers_per_sm": 65536,
        "max_threads_per_sm": 2048,
    }
    budget = oc.sm_budget(device)
    info = SimpleNamespace(threads=128, smem_bytes=lambda d: 1024)
    # registers: 255 per thread -> 8192 per warp -> 8 warps; threads allow 64
    assert oc.resident_warps(info, 64, 255, budget) == 8
    assert oc.resident_warps(info, 64, 64, budget) == 32  # 2048 per warp -> 32 warps
    big = SimpleNamespace(threads=128, smem_bytes=lambda d: 100 * 1024)
    assert oc.resident_warps(big, 64, 64, budget) == 8  # two blocks' shared memory
    with pytest.raises(ValueError, match="regs = 300"):
        oc.resident_warps(info, 64, 300, budget)
    with pytest.raises(ValueError, match="device has no 'registers_per_sm'"):
        oc.sm_budget({"smem_per_sm_bytes": 1, "smem_per_block_optin_bytes": 1})
