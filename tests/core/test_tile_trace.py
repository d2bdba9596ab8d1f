"""The tile trace records the loops' own order and loads, and leaves the library as it was."""

from __future__ import annotations

import pytest

from flashref import SoftmaxState, attention, io_model
from flashref.tile_trace import trace_tiles


def loads(trace, name):
    return [t for what, n, t in trace.events if (what, n) == ("load", name)]


def test_q_outer_visits_row_by_row_and_loads_q_once():
    t = trace_tiles("q_outer", 10, 9, 4, 3)  # ragged: Tr = 3, Tc = 3
    assert t.pairs == [(i, j) for i in range(3) for j in range(3)]
    assert loads(t, "Q") == [0, 1, 2] and loads(t, "K") == [0, 1, 2] * 3 == loads(t, "V")
    assert [t for what, _, t in t.events if what == "store"] == [0, 1, 2]


def test_kv_outer_visits_column_by_column_and_loads_k_once():
    t = trace_tiles("kv_outer", 10, 9, 4, 3)
    assert t.pairs == [(i, j) for j in range(3) for i in range(3)]
    assert loads(t, "K") == [0, 1, 2] == loads(t, "V") and loads(t, "Q") == [0, 1, 2] * 3


@pytest.mark.parametrize("order", ["q_outer", "kv_outer"])
def test_causal_skips_the_tiles_past_the_diagonal(order):
    t = trace_tiles(order, 12, 12, 4, 3, causal=True)
    assert sorted(t.pairs) == [(i, j) for i in range(3) for j in range(4) if 3 * j <= 4 * i + 3]


def test_the_q_outer_key_loads_are_io_models_count():
    Nq, Nk, Br, Bc = 50, 37, 8, 5
    t = trace_tiles("q_outer", Nq, Nk, Br, Bc)
    walk = io_model.walk_q_outer(Nq, Nk, 1, Br=Br, Bc=Bc, itemsize=1)
    assert len(loads(t, "K")) == -(-Nq // Br) * -(-Nk // Bc)
    assert len(loads(t, "Q")) * Br >= walk.reads["Q"]


def test_the_library_is_restored():
    before = (
        attention.prepare_inputs,
        attention.load_tile,
        attention.store_tile,
        SoftmaxState.update,
    )
    trace_tiles("kv_outer", 5, 5, 2, 2)
    with pytest.raises(ValueError, match="order must be"):
        trace_tiles("rows", 5, 5, 2, 2)
    assert (
        attention.prepare_inputs,
        attention.load_tile,
        attention.store_tile,
        SoftmaxState.update,
    ) == before
