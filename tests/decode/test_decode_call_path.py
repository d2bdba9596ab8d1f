"""A paged decode call's block table goes from the call to the launch through few modules.

Every fact about the table (where it is, its shape and dtype) is decided once per call
signature (``flashref.gpu.decode.api.DecodeCall``), so a planned call follows it through the
entry point, the signature, the plan's run and the launch: at most ``MOST`` stays in
flashref's modules (``call_path.module_stays``), whether the table is on the device (read
where it is) or on the host (its values checked on every call, then copied up).
"""

from __future__ import annotations

import numpy as np
import pytest
from call_path import module_stays

MOST = 6


def _paged(cp, B=2, Hq=8, Hkv=2, ps=64, pages=4, d=64):
    rng = np.random.default_rng(0)
    q = cp.asarray(rng.standard_normal((B, Hq, 1, d)).astype(np.float16))
    kp = cp.asarray(rng.standard_normal((B * pages, Hkv, ps, d)).astype(np.float16))
    table = np.arange(B * pages, dtype=np.int32).reshape(B, pages)
    lengths = np.array([ps * pages, ps * pages - 37], np.int32)
    return q, kp, kp.copy(), table, lengths


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["device", "host"])
def test_the_block_table_passes_through_few_modules(cp, where):
    from flashref.gpu import paged_decode_attention

    q, kp, vp, table, lengths = _paged(cp)
    if where == "device":
        table, lengths = cp.asarray(table), cp.asarray(lengths)
    paged_decode_attention(q, kp, vp, table, lengths)  # planned: the signature's first call
    stays, launched = module_stays(lambda: paged_decode_attention(q, kp, vp, table, lengths), table)
    assert launched, f"{where} table: the path reached no launch: {stays}"
    assert len(stays) <= MOST, f"{where} table: {len(stays)} stays: {' -> '.join(stays)}"
    cp.cuda.get_current_stream().synchronize()


def test_the_tracer_counts_each_stay_and_each_return(no_cupy, monkeypatch):
    """The tracer on a CPU: a host table's planned call goes from the entry point to the
    signature and back, into the plan's run (the entry point's module), to the checks of its
    values and back, then asks for the GPU (absent here: no launch)."""
    import flashref.gpu as fg
    from flashref.gpu import _host
    from flashref.gpu.decode import api

    monkeypatch.setattr(api, "_PLANS", _host.Kept())
    q, kp = np.zeros((2, 4, 1, 64), np.float16), np.zeros((6, 2, 16, 64), np.float16)
    table, lengths = np.array([[0, 1], [2, 3]], np.int32), np.array([20, 17], np.int32)

    def call():
        with pytest.raises(fg.GPUUnavailableError):
            fg.paged_decode_attention(q, kp, kp, table, lengths)

    call()  # the plan: made and kept
    stays, launched = module_stays(call, table)
    api_, host, checks = "gpu.decode.api", "gpu._host", "gpu.decode.checks"
    assert stays == [api_, host, api_, checks, api_] and not launched, stays
    assert module_stays(call, np.zeros((3, 5), np.int32)) == ([], False)  # not the table's shape
