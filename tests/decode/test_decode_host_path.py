"""The host side of a decode call without a GPU: a call planned once per signature (its checks
made once), the partials' buffers, the block table's vectorised check.

NumPy arrays stand in for GPU arrays (the checks read only type, shape, dtype and ndim);
valid arguments end in ``GPUUnavailableError`` on a machine without CuPy, after the checks.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import flashref.gpu as fg
from flashref.gpu import _host
from flashref.gpu.decode import api as dec
from flashref.gpu.decode import buffers as ws
from flashref.gpu.decode import checks as dchk


@pytest.fixture
def counted(monkeypatch, no_cupy):
    """No kept plans, and a count of check_kind calls (every plan's checks run it once)."""
    monkeypatch.setattr(dec, "_PLANS", _host.Kept())
    calls = []
    real = dec.check_kind

    def check_kind(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(dec, "check_kind", check_kind)
    return calls


def _qkv(Hq=8, Hkv=2, Nk=100, d=64, dtype=np.float16, B=2):
    return (
        np.zeros((B, Hq, 1, d), dtype),
        np.zeros((B, Hkv, Nk, d), dtype),
        np.zeros((B, Hkv, Nk, d), dtype),
    )


def _call(args, **kw):
    with pytest.raises(fg.GPUUnavailableError):  # the checks passed; the GPU is not here
        fg.decode_attention(*args, **kw)


class Sub(np.ndarray):
    """Another array type with NumPy's shape and dtype."""


@pytest.mark.parametrize(
    "args,kw",
    [
        (_qkv(Nk=120), {}),  # k's shape
        (_qkv(B=3), {}),  # q's shape
        (_qkv(dtype=np.float32), {}),  # the dtype (refused, and so checked again)
        ((_qkv()[0].view(Sub), *_qkv()[1:]), {}),  # q's type
        (_qkv(), {"num_splits": 3}),
        (_qkv(), {"num_splits": np.int64(2)}),  # the type of a scalar
        (_qkv(), {"scale": 0.5}),
        (_qkv(), {"causal": "bottom_right"}),
        (_qkv(), {"return_lse": True}),
        (_qkv(), {"version": 2}),
    ],
)
def test_a_second_call_skips_the_checks_and_any_other_signature_rechecks(counted, args, kw):
    base = {"num_splits": 2, "scale": 0.25, "causal": False, "return_lse": False, "version": 3}
    _call(_qkv(), **base)
    _call(_qkv(), **base)  # new arrays, the same signature: kept
    assert len(counted) == 1
    try:
        fg.decode_attention(*args, **{**base, **kw})
    except (fg.GPUUnavailableError, TypeError):  # float32 is refused after a check
        pass
    assert len(counted) == 2, f"{kw or 'arrays'}: the changed signature was not checked again"
    _call(_qkv(), **base)
    assert len(counted) == 2


def test_paged_checks_are_kept_and_the_table_is_checked_every_call(counted):
    q, kp = np.zeros((2, 4, 1, 64), np.float16), np.zeros((6, 2, 16, 64), np.float16)
    table = np.array([[0, 1], [2, 3]], np.int32)
    for _ in range(2):
        with pytest.raises(fg.GPUUnavailableError):
            fg.paged_decode_attention(q, kp, kp.copy(), table, np.array([20, 17], np.int32))
    assert len(counted) == 1
    bad = np.array([[0, 1], [2, 6]], np.int32)
    for _ in range(2):  # the kept signature does not skip the table's values
        with pytest.raises(ValueError, match=r"block_table\[1, 1\] is 6, a page sequence 1"):
            fg.paged_decode_attention(q, kp, kp.copy(), bad, np.array([20, 17], np.int32))
    assert len(counted) == 1


@pytest.mark.parametrize(
    "kw,error,match",
    [
        ({"causal": 0}, TypeError, r"causal must be False, True, 'top_left' or 'bottom_right', go"),
        ({"num_splits": 2.0}, TypeError, r"num_splits must be an int"),
        ({"return_lse": 0}, TypeError, r"return_lse must be a bool"),
        ({"version": True}, TypeError, r"version must be an int"),
        ({"lengths": [1, 101]}, ValueError, r"lengths\[1\] is 101; expected 0 <= length"),
        ({"num_splits": [2]}, TypeError, r"num_splits must be an int"),  # unhashable: not kept
    ],
)
def test_bad_input_after_good_input_still_raises(counted, kw, error, match):
    good = {"causal": False, "num_splits": 2, "return_lse": False, "version": 1}
    _call(_qkv(), **good)
    for _ in range(2):  # equal to a kept value (0 == False, 2.0 == 2), never taken for it
        with pytest.raises(error, match=match):
            fg.decode_attention(*_qkv(), **{**good, **kw})
    _call(_qkv(), **good)


def test_a_plan_that_raised_is_not_kept(counted):
    q, k, v = _qkv()
    for _ in range(2):  # a refused signature is checked (and refused) on every call
        with pytest.raises(TypeError, match="num_splits must be an int"):
            fg.decode_attention(q, k, v, num_splits=2.5)
    assert len(counted) == 2 and not dec._PLANS.items
    _call((q, k, v))
    assert len(dec._PLANS.items) == 1


def test_the_plans_are_bounded_and_the_oldest_goes_first(no_cupy):
    kept = _host.Kept(kept=3)
    x = np.zeros(2)
    for n in range(5):
        kept.put(_host.signature((x,), (n,)), n)
    assert list(kept.items.values()) == [2, 3, 4]
    assert kept.get(_host.signature((x,), (4,))) == 4 and kept.get(None) is None
    assert _host.signature((object(),), ()) is None  # no shape: never kept
    assert _host.signature((x,), ([1],)) is None  # unhashable option: never kept
    assert _host.signature((x,), (True,)) != _host.signature((x,), (1,))  # a bool is not an int


def _loop_reference(bt, L, P, ps):
    """The first bad (b, j) in row-major order, by a loop over sequences (the old check)."""
    for b in range(bt.shape[0]):
        used = bt[b, : -(-int(L[b]) // ps)]
        bad = np.flatnonzero((used < 0) | (used >= P))
        if bad.size:
            return b, int(bad[0])
    return None


def test_the_vectorised_block_table_check_names_the_loops_entry():
    rng = np.random.default_rng(0)
    P, ps = 10, 4
    for trial in range(300):
        B, pages = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        bt = rng.integers(-2, P + 2, size=(B, pages)).astype(np.int32)
        L = rng.integers(0, pages * ps + 1, size=B).astype(np.int32)
        want = _loop_reference(bt, L, P, ps)
        if want is None:
            out, lens = dchk.check_block_table(bt, L, B, P, ps)
            assert np.array_equal(out, bt) and np.array_equal(lens, L), trial
            continue
        b, j = want
        with pytest.raises(
            ValueError,
            match=rf"block_table\[{b}, {j}\] is {bt[b, j]}, .* "
            rf"\(length {L[b]}\); expected 0 <= page < {P}",
        ):
            dchk.check_block_table(bt, L, B, P, ps)


def _fake_cp(device=0, stream=7):
    """The parts of CuPy the workspace uses: the current device and stream, empty."""
    made = []

    def empty(n, dtype):
        made.append(np.full(n, np.nan, dtype))
        return made[-1]

    cuda = SimpleNamespace(
        Device=lambda: SimpleNamespace(id=device),
        get_current_stream=lambda: SimpleNamespace(ptr=stream),
    )
    return SimpleNamespace(cuda=cuda, empty=empty, float32=np.float32), made


@pytest.fixture
def no_buffers(monkeypatch):
    monkeypatch.setattr(ws, "_partials", {})


@pytest.mark.parametrize("n,size", [(1, 65536), (65536, 65536), (65537, 131072)])
def test_workspace_size_class(n, size):
    assert ws.size_class(n) == size


@pytest.mark.parametrize("n", [0, -1, 2.0, True, None])
def test_workspace_size_class_refuses_a_bad_count(n):
    with pytest.raises(ValueError, match=r"n must be a positive int \(floats of partials\)"):
        ws.size_class(n)


def test_one_workspace_per_device_stream_and_class(no_buffers):
    cp, made = _fake_cp()
    with ws.partials(cp, 32, 8, 128) as (O_part, lse_part):
        assert O_part.shape == (32, 8, 128) and lse_part.shape == (32, 8)
        assert O_part.flags.c_contiguous and lse_part.flags.c_contiguous
        assert O_part.dtype == lse_part.dtype == np.float32
        assert np.shares_memory(O_part, made[0]) and not np.shares_memory(O_part, lse_part)
    with ws.partials(cp, 4, 2, 64) as (O2, _):
        assert np.shares_memory(O2, made[0]) and len(made) == 1  # one class: reused
    with ws.partials(cp, 1024, 64, 128):  # 8.5 M floats: the next classes
        assert len(made) == 2
    for other in (_fake_cp(stream=8)[0], _fake_cp(device=1)[0]):
        with ws.partials(other, 4, 2, 64) as (O3, _):
            assert not np.shares_memory(O3, made[0])


def test_a_launch_that_raises_drops_its_workspace(no_buffers):
    cp, made = _fake_cp()
    with pytest.raises(RuntimeError, match="launch failed"):
        with ws.partials(cp, 4, 2, 64):
            raise RuntimeError("launch failed")
    with ws.partials(cp, 4, 2, 64) as (O_part, _):
        assert len(made) == 2 and np.shares_memory(O_part, made[1])


def test_device_tables_are_checked_by_shape_and_dtype_only():
    ints = np.zeros((2, 5), np.int64)
    dchk.check_device_ints(ints, "block_table", (2, None), "(2, max_pages)")  # any width
    with pytest.raises(ValueError, match=r"block_table has shape \(3, 5\); expected \(2, max"):
        dchk.check_device_ints(
            np.zeros((3, 5), np.int32), "block_table", (2, None), "(2, max_pages)"
        )
    with pytest.raises(TypeError, match="lengths has dtype float32; expected integers"):
        dchk.check_device_ints(np.zeros(2, np.float32), "lengths", (2,), "(2,)")
    with pytest.raises(ValueError, match=r"lengths has shape \(2, 1\)"):
        dchk.check_device_ints(np.zeros((2, 1), np.int32), "lengths", (2,), "(2,)")
    # host arrays are not device arrays: their values are checked on every call
    assert not dchk.is_device_array(np.zeros(2, np.int32))
    assert not dchk.is_device_array([1, 2])
    assert dchk.tables_on_device(False, None, np.zeros(2, np.int32), 2) is False
    assert dchk.tables_on_device(False, None, None, 2) is True  # no table: nothing to read


@pytest.mark.parametrize("which", ["block_table", "lengths"])
def test_masked_host_tables_are_refused(no_cupy, which):
    """As every NumPy function refuses a masked array (its mask would be dropped), so do the
    GPU functions' host tables, naming the table, before any GPU work."""
    q, kp = np.zeros((2, 4, 1, 64), np.float16), np.zeros((6, 2, 64, 64), np.float16)
    tables = {"block_table": np.array([[0, 1], [2, 3]], np.int32), "lengths": np.array([20, 17])}
    tables[which] = np.ma.masked_array(tables[which], mask=np.zeros_like(tables[which], bool))
    match = f"{which} is a numpy.ma.MaskedArray, whose mask would be ignored"
    with pytest.raises(TypeError, match=match):
        fg.paged_decode_attention(q, kp, kp.copy(), tables["block_table"], tables["lengths"])
    with pytest.raises(TypeError, match=match):
        fg.paged_prefill_attention(q, kp, kp.copy(), tables["block_table"], tables["lengths"])
    if which == "lengths":
        with pytest.raises(TypeError, match=match):
            fg.decode_attention(*_qkv(), lengths=np.ma.masked_array([5, 6], mask=[False, True]))


@pytest.mark.parametrize(
    "kw, error, match",
    [
        ({"library": "cupy", "device": 0}, ValueError, "device is for library='torch'"),
        ({"device": -1}, ValueError, "device must be at least 0, got -1"),
        ({"device": 1.0}, TypeError, "device must be an int, got float"),
        ({"dtype": "float32"}, TypeError, "dtype is 'float32'"),
        ({"library": "jax"}, ValueError, "library is 'jax'"),
        ({"max_batch": 0}, ValueError, "max_batch must be at least 1"),
    ],
)
def test_the_device_cache_names_a_bad_argument_without_a_gpu(no_cupy, kw, error, match):
    """The same rules on any machine: a bad argument is named before the GPU is asked for."""
    with pytest.raises(error, match=match):
        fg.DevicePagedKVCache(4, 64, 1, 64, **({"max_batch": 1} | kw))
    with pytest.raises(fg.GPUUnavailableError):  # good arguments: then the GPU is missing
        fg.DevicePagedKVCache(4, 64, 1, 64, max_batch=1)
