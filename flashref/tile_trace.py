"""Which tiles the NumPy loops move, in order: recorded from the library's own loops.

``trace_tiles`` runs ``tiled_attention`` (``order="q_outer"``, FlashAttention-2) or
``tiled_attention_kv_outer`` (``"kv_outer"``, Algorithm 1) on small arrays and records,
through the loads and stores those functions make (``attention.load_tile``, ``store_tile``), every
tile that enters the chip (``Q``, ``K``, ``V`` by tile number) and every output tile written
back (``O``), and every score tile ``(i, j)`` folded into a state (``SoftmaxState.update``).
Nothing is typed by hand: the order and the tile bounds are the functions' own.
``draw_tile_orders`` draws the two orders side by side (chapter 4).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from . import attention
from .state import SoftmaxState


class TileTrace(NamedTuple):
    events: list  # (what, name, tile): ("load", "Q", 0), ("store", "O", 2), ...
    pairs: list  # (i, j): the score tiles, in the order they were folded in


@contextmanager
def _recording(Br: int, Bc: int):
    events, pairs, arrays = [], [], {}
    prepare, load, store, update = (
        attention.prepare_inputs,
        attention.load_tile,
        attention.store_tile,
        SoftmaxState.update,
    )
    last = {"Q": None, "K": None}

    def rec_prepare(*args, **kwargs):
        out = prepare(*args, **kwargs)
        arrays.update(Q=out[0], K=out[1], V=out[2])
        return out

    def rec_load(x, rows, dtype, scale=None):
        name = next(n for n, a in arrays.items() if a is x)
        tile = rows.start // (Br if name == "Q" else Bc)
        events.append(("load", name, tile))
        if name in last:
            last[name] = tile
        return load(x, rows, dtype, scale)

    def rec_store(O, lse, rows, state):
        events.append(("store", "O", rows.start // Br))
        return store(O, lse, rows, state)

    def rec_update(self, s, v=None):
        pairs.append((last["Q"], last["K"]))
        return update(self, s, v)

    attention.prepare_inputs, attention.load_tile, attention.store_tile = (
        rec_prepare,
        rec_load,
        rec_store,
    )
    SoftmaxState.update = rec_update
    try:
        yield TileTrace(events, pairs)
    finally:
        attention.prepare_inputs, attention.load_tile, attention.store_tile = prepare, load, store
        SoftmaxState.update = update


def trace_tiles(
    order: str, Nq: int, Nk: int, block_q: int, block_k: int, causal: bool = False
) -> TileTrace:
    """Run the loop of ``order`` ("q_outer" or "kv_outer") on ``(Nq, 1)`` and ``(Nk, 1)``
    arrays and return its loads, stores and score tiles, in order."""
    fns = {"q_outer": attention.tiled_attention, "kv_outer": attention.tiled_attention_kv_outer}
    if order not in fns:
        raise ValueError(f"order must be 'q_outer' or 'kv_outer', got {order!r}")
    q, k, v = np.zeros((Nq, 1)), np.zeros((Nk, 1)), np.ones((Nk, 1))  # three arrays
    with _recording(block_q, block_k) as trace:
        fns[order](q, k, v, block_q=block_q, block_k=block_k, causal=causal)
    return trace


def draw_tile_orders(Nq: int, Nk: int, block_q: int, block_k: int, causal: bool = False):
    """Two panels, one per loop order: the score tiles numbered in the order they are computed,
    an arrow along that order, and the tiles each order moves between HBM and the chip."""
    import matplotlib.pyplot as plt

    Tr, Tc = -(-Nq // block_q), -(-Nk // block_k)
    titles = {
        "kv_outer": "Algorithm 1: K, V tiles outside",
        "q_outer": "FlashAttention-2: Q tiles outside",
    }
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    for ax, order in zip(axes, titles, strict=True):
        trace = trace_tiles(order, Nq, Nk, block_q, block_k, causal)
        for step, (i, j) in enumerate(trace.pairs):
            ax.add_patch(
                plt.Rectangle(
                    (j, i), 1, 1, facecolor="tab:blue", alpha=0.25, edgecolor="white", linewidth=2
                )
            )
            ax.text(j + 0.5, i + 0.5, str(step + 1), ha="center", va="center", fontsize=11)
        ys, xs = zip(*[(i + 0.5, j + 0.5) for i, j in trace.pairs], strict=True)
        ax.plot(xs, ys, color="tab:red", linewidth=1, alpha=0.6)
        count = {}
        for what, name, _ in trace.events:
            count[what, name] = count.get((what, name), 0) + 1
        moved = (
            f"from HBM: Q {count.get(('load', 'Q'), 0)}, K {count.get(('load', 'K'), 0)},"
            f" V {count.get(('load', 'V'), 0)} tiles"
        )
        if order == "kv_outer":  # each visit brings O_i, l_i, m_i in and writes them back
            moved += f"; O_i, l_i, m_i {len(trace.pairs)} round trips"
        moved += f"\nto HBM: O {count.get(('store', 'O'), 0)} tiles at the end"
        ax.set(
            xlim=(0, Tc),
            ylim=(Tr, 0),
            aspect="equal",
            xticks=np.arange(Tc) + 0.5,
            yticks=np.arange(Tr) + 0.5,
        )
        ax.set_xticklabels([f"K{j}, V{j}" for j in range(Tc)], fontsize=10)
        ax.set_yticklabels([f"Q{i}" for i in range(Tr)], fontsize=10)
        ax.set_title(titles[order], fontsize=12)
        ax.set_xlabel(moved, fontsize=10)
        ax.tick_params(length=0)
    fig.tight_layout()
    return fig
