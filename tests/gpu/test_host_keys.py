"""The keys and the store behind every per-signature cache of the GPU calls
(``flashref.gpu._host.signature`` and ``Kept``), without a GPU: stand-in tensors whose type
lives in a module named torch carry the shape, dtype and device a key reads."""

from __future__ import annotations

import pytest

from flashref.gpu import _host


class Tensor:
    """A stand-in torch tensor: what ``signature`` reads."""

    __module__ = "torch.stand_in"

    def __init__(self, shape, dtype="float16", device=0):
        self.shape, self.dtype, self._device = tuple(shape), dtype, device

    def get_device(self):
        return self._device


def _key(*arrays, scalars=(False, None)):
    return _host.signature(arrays, scalars)


def test_a_signature_is_the_same_for_new_arrays_of_the_same_kind():
    a = _key(Tensor((2, 8, 64)), Tensor((2, 8, 64)))
    assert a is not None and a == _key(Tensor((2, 8, 64)), Tensor((2, 8, 64)))


@pytest.mark.parametrize(
    "other",
    [
        lambda: _key(Tensor((2, 9, 64)), Tensor((2, 8, 64))),  # a shape
        lambda: _key(Tensor((2, 8, 64), "bfloat16"), Tensor((2, 8, 64))),  # a dtype
        lambda: _key(Tensor((2, 8, 64)), Tensor((2, 8, 64), device=1)),  # a device
        lambda: _key(Tensor((2, 8, 64)), None),  # an array not given
        lambda: _key(Tensor((2, 8, 64)), Tensor((2, 8, 64)), scalars=(0, None)),  # 0 is not False
        lambda: _key(Tensor((2, 8, 64)), Tensor((2, 8, 64)), scalars=(False, 1)),  # a scale
    ],
)
def test_anything_a_check_reads_makes_another_signature(other):
    assert other() != _key(Tensor((2, 8, 64)), Tensor((2, 8, 64)))


def test_no_signature_where_it_cannot_be_built():
    assert _key(Tensor((2, 8, 64)), scalars=([1],)) is None  # an unhashable option
    assert _key(Tensor((2, 8, 64)), object()) is None  # no shape, no device


def test_kept_holds_at_most_its_count_and_drops_the_oldest():
    kept = _host.Kept(2)
    assert kept.put("a", 1) == 1 and kept.put("b", 2) == 2 and kept.put("c", 3) == 3
    assert kept.get("a") is None and kept.get("b") == 2 and kept.get("c") == 3
    assert kept.put(None, 4) == 4 and kept.get(None) is None  # a key of None is not kept
