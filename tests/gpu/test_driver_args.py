"""How ``flashref.gpu._driver`` packs a launch's arguments, without a GPU: the kinds read from
the values the direct routes pass, and the buffer layout the driver's pointer array points
into (each value at its alignment, in order)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from flashref.gpu import _driver


def test_kinds_follow_the_values():
    args = (1 << 40, 0, np.int32(3), np.float32(0.5), np.int64(7), b"\0" * 128)
    assert _driver.kinds_of(args) == "ppifqm"


@pytest.mark.parametrize(
    "bad", [True, 1.5, np.int16(2), np.float64(1.0), b"\0" * 64, None, "p"], ids=repr
)
def test_a_value_of_no_kind_is_named(bad):
    with pytest.raises(TypeError, match="launch argument 1 is a"):
        _driver.kinds_of((0, bad))


def test_layout_aligns_each_value_and_packs_what_it_reads():
    fmt, offsets, size = _driver.layout("pifpmi")
    assert offsets == (0, 8, 12, 16, 64, 192) and size == 196
    buf = bytearray(size)
    ptr, m = 0x7F00_1234_5678, bytes(range(128))
    struct.pack_into(fmt, buf, 0, ptr, np.int32(-5), np.float32(2.5), 0, m, np.int32(9))
    assert int.from_bytes(buf[0:8], "little") == ptr
    assert struct.unpack_from("<i", buf, 8)[0] == -5
    assert struct.unpack_from("<f", buf, 12)[0] == 2.5
    assert buf[64:192] == m
    assert struct.unpack_from("<i", buf, 192)[0] == 9


def test_an_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="argument kind 'x'"):
        _driver.layout("px")
