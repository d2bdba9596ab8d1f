"""The IO argument of FlashAttention, counted: the bytes a tiled loop moves to and from HBM.

Two memories: HBM holds Q, K, V and O; an on-chip memory of ``M`` bytes holds
the tiles being worked on. Every load of a tile into the on-chip memory and
every store back to HBM is counted, in bytes, per array (``Q``, ``K``, ``V``,
``O``, the statistics ``m``, ``l``, ``lse``, and for standard attention ``S``
and ``P``): the quantity of Theorem 2 of the FlashAttention paper, where
standard attention needs Theta(N d + N^2) HBM accesses and FlashAttention
Theta(N^2 d^2 / M). Counts are for one (batch, head); ``Traffic.times(B * H)``
scales them to a call. Matrices have ``itemsize`` bytes per element, the flash
statistics ``stat_itemsize`` (float32, as in the kernels).

- ``walk_kv_outer`` / ``walk_q_outer`` walk the loops of Algorithm 1
  (``tiled_attention_kv_outer``) and FlashAttention-2 (``tiled_attention``),
  counting each access; ``closed_form_*`` give the same numbers from formulas;
  ``paper_blocks`` / ``fa2_blocks`` derive the tile sizes from M.
- ``standard_traffic`` counts unfused attention step by step: ``ALGORITHM_0``
  (the paper's) or ``NAIVE_CUPY`` (``flashref.bench``'s naive CuPy).
- ``gpu_traffic``: what a GPU's DRAM and L2 see for a flash kernel;
  ``load_measured`` / ``compare`` set the model beside recorded counters.
"""

from __future__ import annotations

import json
import numbers
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ._checks import check_block

STATS = ("m", "l", "lse")  # stat_itemsize bytes per element in the flash loops


def _count(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _dims(Nq, Nk, d, dv):
    dv = d if dv is None else dv
    return _count(Nq, "Nq"), _count(Nk, "Nk"), _count(d, "d"), _count(dv, "dv")


def _flag(value, name: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Traffic:
    """Bytes read from HBM and written to HBM, per array name."""

    reads: dict[str, int]
    writes: dict[str, int]

    @property
    def read_bytes(self) -> int:
        return sum(self.reads.values())

    @property
    def write_bytes(self) -> int:
        return sum(self.writes.values())

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def times(self, n) -> Traffic:
        """The traffic of ``n`` independent heads (``n = B * H`` for one call)."""
        n = _count(n, "n")
        reads = {k: n * b for k, b in self.reads.items()}
        return Traffic(reads, {k: n * b for k, b in self.writes.items()})


class _Counter:
    """Adds up the bytes of each load (HBM -> on chip) and store (on chip -> HBM), by array."""

    def __init__(self, itemsize, stat_itemsize):
        self.s, self.st = _count(itemsize, "itemsize"), _count(stat_itemsize, "stat_itemsize")
        self.reads, self.writes = Counter(), Counter()

    def load(self, name: str, elements: int) -> None:
        self.reads[name] += elements * (self.st if name in STATS else self.s)

    def store(self, name: str, elements: int) -> None:
        self.writes[name] += elements * (self.st if name in STATS else self.s)

    def traffic(self) -> Traffic:
        return Traffic(dict(self.reads), dict(self.writes))


def paper_blocks(M, d, itemsize=2) -> tuple[int, int]:
    """Algorithm 1's tile sizes ``(Br, Bc)``: ``Bc = ceil(M / 4d)``, ``Br = min(Bc, d)``.

    ``M`` is in bytes; the paper's formula counts elements, ``M // itemsize``.
    """
    M, d, itemsize = _count(M, "M"), _count(d, "d"), _count(itemsize, "itemsize")
    elements = M // itemsize
    if elements < 4 * d:
        raise ValueError(
            f"M = {M} bytes holds {elements} elements of {itemsize} bytes; "
            f"one row each of Q, K, V and O needs 4 * d = {4 * d}"
        )
    Bc = _ceil_div(elements, 4 * d)
    return min(Bc, d), Bc


def fa2_blocks(M, d, itemsize=2) -> tuple[int, int]:
    """Tile sizes ``(Br, Bc)`` for queries outside: ``Br = ceil(M / 4d)``, ``Bc = min(Br, d)``.

    With queries outside, K and V are read once per query tile: the traffic
    falls as Br grows and does not depend on Bc. So the paper's sizes are used
    with the roles swapped: the same on-chip footprint, the large side on the
    tile that is reused.
    """
    Bc, Br = paper_blocks(M, d, itemsize)
    return Br, Bc


def walk_kv_outer(Nq, Nk, d, dv=None, *, Br, Bc, itemsize=2, stat_itemsize=4, causal=False):
    """Walk Algorithm 1 (keys and values outside), counting every HBM access.

    Line 2 writes the initial O, l, m to HBM; each K_j, V_j is loaded once
    (line 6); each visit of a query tile loads Q_i, O_i, l_i, m_i (line 8) and
    writes O_i, l_i, m_i back (lines 12-13). With ``causal`` (top-left), a
    query tile whose every query precedes every key of K_j is not visited, as
    in ``tiled_attention_kv_outer``.
    """
    Nq, Nk, d, dv = _dims(Nq, Nk, d, dv)
    Br, Bc, causal = check_block(Br, "Br"), check_block(Bc, "Bc"), _flag(causal, "causal")
    io = _Counter(itemsize, stat_itemsize)
    for name, n in (("O", Nq * dv), ("l", Nq), ("m", Nq)):
        io.store(name, n)  # line 2: initialise in HBM
    for c0 in range(0, Nk, Bc):  # Tc key/value tiles
        cols = min(c0 + Bc, Nk) - c0
        io.load("K", cols * d)  # K_j (Bc, d), once
        io.load("V", cols * dv)  # V_j (Bc, dv), once
        for r0 in range(0, Nq, Br):  # Tr query tiles, for every j
            rows = min(r0 + Br, Nq) - r0
            if causal and c0 > r0 + rows - 1:
                continue  # every key of K_j is after every query of Q_i
            for name, n in (("Q", rows * d), ("O", rows * dv), ("l", rows), ("m", rows)):
                io.load(name, n)  # Q_i (Br, d), O_i (Br, dv), l_i, m_i (Br,)
            for name, n in (("O", rows * dv), ("l", rows), ("m", rows)):
                io.store(name, n)
    return io.traffic()


def walk_q_outer(Nq, Nk, d, dv=None, *, Br, Bc, itemsize=2, stat_itemsize=4, causal=False):
    """Walk ``tiled_attention``'s loops (FlashAttention-2, queries outside), counting accesses.

    Q_i is loaded once and its state stays on chip while every K_j, V_j
    streams past; O_i (divided by l_i) and lse_i are written once. With
    ``causal`` (top-left) the key loop stops at the tile's last query and the
    last key tile is cut there, as in ``tiled_attention``.
    """
    Nq, Nk, d, dv = _dims(Nq, Nk, d, dv)
    Br, Bc, causal = check_block(Br, "Br"), check_block(Bc, "Bc"), _flag(causal, "causal")
    io = _Counter(itemsize, stat_itemsize)
    for r0 in range(0, Nq, Br):  # Tr query tiles
        rows = min(r0 + Br, Nq) - r0
        io.load("Q", rows * d)  # Q_i (Br, d), once
        k_end = min(Nk, r0 + rows) if causal else Nk
        for c0 in range(0, k_end, Bc):  # key/value tiles, for every i
            cols = min(c0 + Bc, k_end) - c0
            io.load("K", cols * d)  # K_j (Bc, d), again for every query tile
            io.load("V", cols * dv)  # V_j (Bc, dv)
        io.store("O", rows * dv)  # O_i (Br, dv), once
        io.store("lse", rows)  # lse_i (Br,), once
    return io.traffic()


def closed_form_q_outer(Nq, Nk, d, dv=None, *, Br, Bc, itemsize=2, stat_itemsize=4, causal=False):
    """``walk_q_outer``'s counts from a formula: Q, O, lse once, K and V ``Tr`` times.

    With ``causal``, query tile i loads ``min((i + 1) Br, E)`` keys, E = min(Nq,
    Nk): a staircase of ``a = E // Br`` steps, then E for each remaining tile.
    ``Bc`` does not appear: it changes how K and V are cut, not how often.
    """
    Nq, Nk, d, dv = _dims(Nq, Nk, d, dv)
    Br, _, causal = check_block(Br, "Br"), check_block(Bc, "Bc"), _flag(causal, "causal")
    s, st = _count(itemsize, "itemsize"), _count(stat_itemsize, "stat_itemsize")
    Tr, E = _ceil_div(Nq, Br), min(Nq, Nk)
    a = E // Br
    keys = Br * a * (a + 1) // 2 + (Tr - a) * E if causal else Tr * Nk  # summed over tiles
    return Traffic(
        {"Q": Nq * d * s, "K": keys * d * s, "V": keys * dv * s}, {"O": Nq * dv * s, "lse": Nq * st}
    )


def closed_form_kv_outer(Nq, Nk, d, dv=None, *, Br, Bc, itemsize=2, stat_itemsize=4, causal=False):
    """``walk_kv_outer``'s counts from a formula: K, V once; Q, O, l, m once per visit.

    Without ``causal`` every query row is visited ``Tc = ceil(Nk / Bc)`` times.
    With it, the query tile ending at row r1 meets ``min(Tc, ceil(r1 / Bc))``
    key tiles; that sum over the ``Tr`` query tiles has no neater form.
    """
    Nq, Nk, d, dv = _dims(Nq, Nk, d, dv)
    Br, Bc, causal = check_block(Br, "Br"), check_block(Bc, "Bc"), _flag(causal, "causal")
    s, st = _count(itemsize, "itemsize"), _count(stat_itemsize, "stat_itemsize")
    Tc = _ceil_div(Nk, Bc)
    if causal:  # query rows visited, summed over key tiles
        tiles = [(r0, min(r0 + Br, Nq)) for r0 in range(0, Nq, Br)]
        visits = sum((r1 - r0) * min(Tc, _ceil_div(r1, Bc)) for r0, r1 in tiles)
    else:
        visits = Tc * Nq
    n = Nq + visits  # stores: the initial ones and one per visit
    return Traffic(
        {
            "K": Nk * d * s,
            "V": Nk * dv * s,
            "Q": visits * d * s,
            "O": visits * dv * s,
            "l": visits * st,
            "m": visits * st,
        },
        {"O": n * dv * s, "l": n * st, "m": n * st},
    )


def flash_traffic(Nq, Nk, d, M, *, order, itemsize=2, stat_itemsize=4, causal=False, walk=False):
    """Traffic of a loop order with tile sizes derived from ``M`` bytes of on-chip memory.

    ``order``: ``"kv_outer"`` (Algorithm 1, ``paper_blocks``) or ``"q_outer"``
    (FlashAttention-2, ``fa2_blocks``). ``walk=True`` walks the loops instead
    of using the closed form: the same numbers, more slowly.
    """
    forms = {
        "kv_outer": (paper_blocks, walk_kv_outer, closed_form_kv_outer),
        "q_outer": (fa2_blocks, walk_q_outer, closed_form_q_outer),
    }
    if order not in forms:
        raise ValueError(f"order must be 'kv_outer' or 'q_outer', got {order!r}")
    blocks, walker, formula = forms[order]
    walk = _flag(walk, "walk")
    Br, Bc = blocks(M, d, itemsize)
    count = walker if walk else formula
    return count(
        Nq, Nk, d, Br=Br, Bc=Bc, itemsize=itemsize, stat_itemsize=stat_itemsize, causal=causal
    )


# Unfused attention, one step (one kernel) a line: (what it does, arrays read, arrays written).
ALGORITHM_0 = (  # the paper's standard attention
    ("S = Q K^T", ("Q", "K"), ("S",)),
    ("P = softmax(S)", ("S",), ("P",)),
    ("O = P V", ("P", "V"), ("O",)),
)
NAIVE_CUPY = (  # flashref.bench.forward.naive_cupy, not causal; P is written over S
    ("S = q @ k^T", ("Q", "K"), ("S",)),
    ("S *= scale", ("S",), ("S",)),
    ("m = S.max(-1)", ("S",), ("m",)),
    ("S -= m", ("S", "m"), ("S",)),
    ("exp(S, out=S)", ("S",), ("S",)),
    ("l = S.sum(-1)", ("S",), ("l",)),
    ("S /= l", ("S", "l"), ("S",)),
    ("O = S @ v", ("S", "V"), ("O",)),
)


def standard_traffic(Nq, Nk, d, dv=None, *, itemsize=2, steps=ALGORITHM_0):
    """Bytes moved by unfused attention: each step reads its inputs from HBM, writes its outputs.

    Every array, S, P and the row statistics included, has ``itemsize`` bytes
    per element (unfused code keeps them in the inputs' dtype). A step's reads
    of its operands are counted once each, as in the paper's count: re-reads
    inside one matrix product are the caches' business.
    """
    Nq, Nk, d, dv = _dims(Nq, Nk, d, dv)
    size = {
        "Q": Nq * d,
        "K": Nk * d,
        "V": Nk * dv,
        "O": Nq * dv,
        "S": Nq * Nk,
        "P": Nq * Nk,
        "m": Nq,
        "l": Nq,
    }
    io = _Counter(itemsize, itemsize)
    for what, reads, writes in steps:
        for name in (*reads, *writes):
            if name not in size:
                raise ValueError(f"step {what!r} names {name!r}; arrays are {sorted(size)}")
        for name in reads:
            io.load(name, size[name])
        for name in writes:
            io.store(name, size[name])
    return io.traffic()


class GPUTraffic(NamedTuple):
    dram: Traffic  # what HBM (DRAM) serves
    l2: Traffic  # what the SMs ask of the L2 cache, at least
    kv_fits_l2: bool  # one head's K and V fit in L2


def gpu_traffic(Nq, Nk, d, dv=None, *, Br, heads, l2_bytes, itemsize=2, causal=False):
    """What a GPU moves for a FlashAttention-2-order kernel with query tiles of ``Br`` rows.

    Every tile load and store goes through L2, so the SMs ask L2 for at least
    the whole walk: K and V once per query tile. The blocks running at one time are consecutive
    query tiles of a few heads, so if one head's K and V fit in L2 the
    re-reads hit there and DRAM serves only the compulsory traffic (Q, K, V
    read once, O and lse written once); if not, every re-read is counted as
    DRAM traffic too (an upper bound). The kernels write lse in float32.
    """
    Nq, Nk, d, dv = _dims(Nq, Nk, d, dv)
    heads, l2_bytes, s = _count(heads, "heads"), _count(l2_bytes, "l2_bytes"), itemsize
    walk = closed_form_q_outer(Nq, Nk, d, dv, Br=Br, Bc=1, itemsize=s, causal=causal)
    keys = min(Nq, Nk) if causal else Nk  # every key some query sees, once
    once = Traffic(dict(walk.reads, K=keys * d * s, V=keys * dv * s), walk.writes)
    fits = (Nk * d + Nk * dv) * s <= l2_bytes
    return GPUTraffic((once if fits else walk).times(heads), walk.times(heads), fits)


# The schema of results/gpu_io.json (recorded on the GPU with Nsight Compute).
_NUM, _NONE = numbers.Real, type(None)
_META = {"gpu": str, "ncu": str, "cupy": str, "date": str, "clock_control": str}
# written by later versions of ``python -m flashref.bench profile``; checked when present
_META_OPTIONAL = {"driver": str, "nvidia_smi": str, "torch": (str, _NONE), "l2_cache_bytes": _NUM}
_ROW = {
    "impl": str,
    "label": str,
    "N": int,
    "B": int,
    "H": int,
    "d": int,
    "causal": bool,
    "dtype": str,
    "kernels": int,
    "dram_read_bytes": _NUM,
    "dram_write_bytes": _NUM,
    "l2_bytes": _NUM,
    "ms": (_NUM, _NONE),
}
ITEMSIZE = {"float16": 2, "float32": 4}


def _check_fields(obj, schema, where, optional=False):
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(obj).__name__}")
    for key, kind in schema.items():
        if key not in obj:
            if optional:
                continue
            raise ValueError(f"{where} has no {key!r}")
        value = obj[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise ValueError(f"{where}[{key!r}] = {value!r}; expected {kind}")
        if isinstance(value, _NUM) and not isinstance(value, bool) and not value >= 0:
            raise ValueError(f"{where}[{key!r}] = {value!r}; expected a number >= 0")
        if kind is int and value < 1:
            raise ValueError(f"{where}[{key!r}] = {value!r}; expected an int >= 1")


def load_measured(path):
    """Read a ``results/gpu_io.json`` as ``(meta, rows)``, checking every field of the schema.

    Raises ``ValueError`` naming the file, the row and the field for anything
    missing, of the wrong type, negative, NaN or infinite.
    """
    path = Path(path)

    def no_constant(name):  # json.loads accepts NaN and Infinity unless told not to
        raise ValueError(f"{path}: {name} is not a measurement")

    data = json.loads(path.read_text(), parse_constant=no_constant)
    _check_fields(data, {"meta": dict, "rows": list}, str(path))
    _check_fields(data["meta"], _META, f"{path}: meta")
    _check_fields(data["meta"], _META_OPTIONAL, f"{path}: meta", optional=True)
    for i, row in enumerate(data["rows"]):
        _check_fields(row, _ROW, f"{path}: rows[{i}]")
        if row["dtype"] not in ITEMSIZE:
            raise ValueError(f"{path}: rows[{i}]['dtype'] = {row['dtype']!r}; not {list(ITEMSIZE)}")
    return data["meta"], data["rows"]


def compare(rows, *, Br, l2_bytes):
    """The model beside each measured row: one dict per row, ratios measured / model.

    ``Br`` maps each flash ``impl`` to its query-tile rows; rows whose impl
    starts with ``naive_cupy`` are modelled by ``NAIVE_CUPY`` (L2 then sees at
    least those passes) and shown beside ``ALGORITHM_0``.
    """
    table = []
    for row in rows:
        impl, N, d, heads = row["impl"], row["N"], row["d"], row["B"] * row["H"]
        s = ITEMSIZE[row["dtype"]]
        if impl.startswith("naive_cupy"):
            if row["causal"]:
                raise ValueError(f"{impl}, causal: naive CuPy's causal bias pass is not modelled")
            dram = l2 = standard_traffic(N, N, d, itemsize=s, steps=NAIVE_CUPY).times(heads)
        elif impl in Br:
            dram, l2, _ = gpu_traffic(
                N,
                N,
                d,
                Br=Br[impl],
                heads=heads,
                l2_bytes=l2_bytes,
                itemsize=s,
                causal=row["causal"],
            )
        else:
            raise ValueError(f"no model for impl {impl!r}: give its query-tile rows in Br")
        measured = row["dram_read_bytes"] + row["dram_write_bytes"]
        table.append(
            dict(
                impl=impl,
                label=row["label"],
                N=N,
                B=row["B"],
                H=row["H"],
                d=d,
                causal=row["causal"],
                ms=row["ms"],
                algorithm0_bytes=standard_traffic(N, N, d, itemsize=s).times(heads).total_bytes,
                model_dram_bytes=dram.total_bytes,
                dram_bytes=measured,
                dram_ratio=measured / dram.total_bytes,
                model_l2_bytes=l2.total_bytes,
                l2_bytes=row["l2_bytes"],
                l2_ratio=row["l2_bytes"] / l2.total_bytes,
            )
        )
    return table
