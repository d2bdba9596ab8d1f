"""A paged KV cache, laid out as vLLM's PagedAttention keeps one, and attention that reads it.

While a model generates text it keeps the keys and values of every token of every
sequence so far. Giving each sequence one contiguous buffer of its longest possible
length wastes most of it; growing buffers means copies. A paged cache cuts memory into
pages of ``page_size`` tokens, drawn from one pool as a sequence grows:

    k_pages (num_pages, Hkv, page_size, d)     v_pages (num_pages, Hkv, page_size, dv)

Each sequence has a block table, the list of its pages in order, and a length: token
``t`` of the sequence lives in slot ``t % page_size`` of page ``block_table[t //
page_size]``, and only the first ``length - (pages - 1) * page_size`` slots of its last
page are filled. Pages need not be adjacent or in order; a finished sequence's pages go
back to the pool for the next one.

``paged_attention`` attends a batch of sequences of different lengths, ``Nq`` new queries
each, to their cached keys and values, reading only the pages in use and, of the last
page, only the filled slots: a page is one key/value tile (``Bc = page_size``) of the
tiled loop of ``flashref.attention``. A GPU decode kernel takes the same arguments, the
two pools, ``block_table`` and ``lengths`` from ``PagedKVCache.block_table``, and follows
the block table the same way.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np

from ._checks import (
    FLOAT_DTYPES,
    accumulation_dtype,
    as_float_array,
    causal_bottom_right,
    check_block,
    check_flag,
    check_scale,
    group_size,
)
from .attention import allowed_pairs, finish_output, load_tile, pack_heads, store_tile
from .state import SoftmaxState


class CacheFullError(RuntimeError):
    """``append`` needs more pages than the pool has free."""


class PageTable:
    """The host's bookkeeping of a paged cache: a free list of pages, and each sequence's
    block table and length. It allocates and frees; it holds no keys or values, so the CPU
    cache (``PagedKVCache``) and the GPU one (``flashref.gpu.DevicePagedKVCache``) share it.

    Args:
        num_pages: pages in the pool; page_size: tokens per page.

    Attributes:
        block_tables: ``{seq: [page, ...]}``; lengths: ``{seq: tokens}`` (to read).
    """

    def __init__(self, num_pages, page_size):
        self.num_pages = check_block(num_pages, "num_pages")
        self.page_size = check_block(page_size, "page_size")
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self._free = list(range(self.num_pages))  # handed out from the front, returned at the back
        self._next_seq = 0

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def new_sequence(self) -> int:
        """Start an empty sequence (length 0, no pages); returns its id."""
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        self.block_tables[seq], self.lengths[seq] = [], 0
        return seq

    def check_seq(self, seq, name: str = "seq") -> int:
        """``seq`` as an int, after checking it is a live sequence of this table."""
        if isinstance(seq, (bool, np.bool_)) or not isinstance(seq, numbers.Integral):
            raise TypeError(f"{name} must be an int (a sequence id), got {type(seq).__name__}")
        if int(seq) not in self.lengths:
            raise ValueError(
                f"{name} {seq} is not a sequence of this cache (its sequences: "
                f"{sorted(self.lengths)}); start one with new_sequence()"
            )
        return int(seq)

    def pages_needed(self, seq: int, new: int) -> int:
        """New pages sequence ``seq`` (checked) needs to hold ``new`` tokens past its length."""
        tokens = self.lengths[seq] + new
        return max(0, -(-tokens // self.page_size) - len(self.block_tables[seq]))

    def check_needs(self, needs) -> dict:
        """``needs`` (``{seq: new tokens}``) checked whole, before anything changes: a mapping
        whose keys are live sequences and whose values are ints >= 0 (not bools, not floats);
        the error names the entry. Returns it as ``{int: int}``."""
        if not isinstance(needs, Mapping):
            raise TypeError(f"needs must be a dict {{seq: new tokens}}, got {type(needs).__name__}")
        return {
            self.check_seq(s, "needs key"): check_block(t, f"needs[{s!r}]", minimum=0)
            for s, t in needs.items()
        }

    def check_room(self, needs) -> None:
        """``CacheFullError`` unless the free pages cover ``needs``: ``{seq: new tokens}``
        (tokens past the sequence's length; checked by ``check_needs``). Nothing changes
        either way."""
        needs = self.check_needs(needs)
        needed = {s: self.pages_needed(s, t) for s, t in needs.items()}
        total = sum(needed.values())
        if total > len(self._free):
            s = max(needed, key=needed.get)
            raise CacheFullError(
                f"the cache is full: sequence {s} ({self.lengths[s]} tokens) needs "
                f"{needed[s]} more pages of {self.page_size} tokens for {needs[s]} new ones"
                + (
                    f" ({total} for the {len(needed)} sequences of the step)"
                    if len(needed) > 1
                    else ""
                )
                + f", but {len(self._free)} of {self.num_pages} are free; free a finished "
                "sequence or make a larger cache"
            )

    def reserve(self, needs) -> dict:
        """Give each sequence of ``needs`` (``{seq: new tokens}``) the pages to hold that many
        tokens past its length, all or nothing: every entry is checked (``check_needs``) and
        the room for all of them (``check_room``) before a page is given; lengths do not
        change.
        Returns ``{seq: index of its first new page in its block table}`` for those that got
        pages."""
        needs = self.check_needs(needs)
        self.check_room(needs)
        first = {}
        for s, tokens in needs.items():
            n = self.pages_needed(s, tokens)
            if n:
                first[s] = len(self.block_tables[s])
                self.block_tables[s] += [self._free.pop(0) for _ in range(n)]
        return first

    def free(self, seq) -> None:
        """End sequence ``seq``: its pages go back to the pool, its id is no longer valid."""
        seq = self.check_seq(seq)
        self._free += self.block_tables.pop(seq)
        del self.lengths[seq]

    def table(self, seqs, width=None):
        """``(block_table (B, width) int64 padded with -1, lengths (B,) int64)`` of ``seqs``
        (ids, checked; repeats allowed); ``width`` default: the longest table (an int at least
        that long, else an error naming it)."""
        if isinstance(seqs, (str, bytes)) or not hasattr(seqs, "__len__"):
            raise TypeError(f"seqs must be a list of sequence ids, got {type(seqs).__name__}")
        seqs = [self.check_seq(s, f"seqs[{i}]") for i, s in enumerate(seqs)]
        longest = max((len(self.block_tables[s]) for s in seqs), default=0)
        if width is None:
            width = longest
        elif check_block(width, "width", minimum=0) < longest:
            s = max(seqs, key=lambda s: len(self.block_tables[s]))
            raise ValueError(
                f"width is {width} but sequence {s} holds {longest} pages; width must be at "
                f"least {longest} (or None: the longest table)"
            )
        table = np.full((len(seqs), width), -1, dtype=np.int64)  # (B, max_pages)
        for b, s in enumerate(seqs):
            table[b, : len(self.block_tables[s])] = self.block_tables[s]
        return table, np.array([self.lengths[s] for s in seqs], dtype=np.int64)  # (B,)


class PagedKVCache:
    """A pool of K/V pages, a block table and a length per sequence.

    Args:
        num_pages: pages in the pool; page_size: tokens per page.
        num_kv_heads: ``Hkv``; head_dim: ``d``; head_dim_v: ``dv`` (default ``d``).
        dtype: float16, float32 or float64; what is appended must have it.

    Attributes:
        k_pages, v_pages: the pools, ``(num_pages, Hkv, page_size, d / dv)``.
        block_tables: ``{seq: [page, ...]}``; lengths: ``{seq: tokens}``, per sequence
            (to read: ``append`` and ``free`` keep them consistent with the pool).
        pages: the ``PageTable`` that holds them.
    """

    def __init__(
        self, num_pages, page_size, num_kv_heads, head_dim, head_dim_v=None, *, dtype=np.float32
    ):
        self.pages = PageTable(num_pages, page_size)
        self.page_size = self.pages.page_size
        self.num_kv_heads = check_block(num_kv_heads, "num_kv_heads")
        self.head_dim = check_block(head_dim, "head_dim")
        dv = head_dim if head_dim_v is None else head_dim_v
        self.head_dim_v = check_block(dv, "head_dim_v")
        try:  # np.dtype(None) would be float64: None is refused like any non-dtype
            self.dtype = None if dtype is None else np.dtype(dtype)
        except TypeError:
            self.dtype = None
        if self.dtype is not None and self.dtype.kind == "f":  # '>f4': held in native order,
            self.dtype = self.dtype.newbyteorder("=")  # as every input array is (as_float_array)
        if self.dtype is None or self.dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype is {dtype!r}; expected float16, float32 or float64")
        shape = (self.pages.num_pages, self.num_kv_heads, self.page_size)
        self.k_pages = np.zeros(shape + (self.head_dim,), self.dtype)  # (P, Hkv, ps, d)
        self.v_pages = np.zeros(shape + (self.head_dim_v,), self.dtype)  # (P, Hkv, ps, dv)

    @property
    def block_tables(self) -> dict[int, list[int]]:
        return self.pages.block_tables

    @property
    def lengths(self) -> dict[int, int]:
        return self.pages.lengths

    @property
    def num_pages(self) -> int:
        return self.pages.num_pages

    @property
    def num_free_pages(self) -> int:
        return self.pages.num_free_pages

    def new_sequence(self) -> int:
        """Start an empty sequence (length 0, no pages); returns its id."""
        return self.pages.new_sequence()

    def append(self, seq, k_new, v_new) -> None:
        """Add ``n`` tokens to sequence ``seq``: ``k_new (Hkv, n, d)``, ``v_new (Hkv, n, dv)``.

        Pages are taken from the pool as the sequence crosses page boundaries. Everything
        is checked first; when the pool has too few free pages, ``CacheFullError`` is
        raised and nothing is written.
        """
        seq = self.pages.check_seq(seq)
        k_new, v_new = as_float_array(k_new, "k_new"), as_float_array(v_new, "v_new")
        Hkv, ps = self.num_kv_heads, self.page_size
        for name, x, w in (("k_new", k_new, self.head_dim), ("v_new", v_new, self.head_dim_v)):
            if x.ndim != 3 or x.shape[0] != Hkv or x.shape[2] != w:
                raise ValueError(
                    f"{name} has shape {x.shape}; expected (Hkv, n, {w}) with Hkv = {Hkv}"
                )
            if x.dtype != self.dtype:
                raise TypeError(
                    f"{name} has dtype {x.dtype} but the cache holds {self.dtype}; "
                    f"convert it with {name}.astype(np.{self.dtype})"
                )
        if v_new.shape[1] != k_new.shape[1]:
            raise ValueError(f"v_new has {v_new.shape[1]} tokens but k_new has {k_new.shape[1]}")
        start, n = self.lengths[seq], k_new.shape[1]
        self.pages.reserve({seq: n})  # CacheFullError before anything changes
        table = self.block_tables[seq]
        for t0 in range(start - start % ps, start + n, ps):  # each page the new tokens touch
            lo, hi = max(t0, start), min(t0 + ps, start + n)  # positions it receives
            page = table[t0 // ps]
            self.k_pages[page, :, lo - t0 : hi - t0] = k_new[:, lo - start : hi - start]
            self.v_pages[page, :, lo - t0 : hi - t0] = v_new[:, lo - start : hi - start]
        self.lengths[seq] = start + n

    def free(self, seq) -> None:
        """End sequence ``seq``: its pages go back to the pool, its id is no longer valid."""
        self.pages.free(seq)

    def block_table(self, seqs):
        """The block tables of ``seqs`` as one array, as a GPU kernel takes them.

        Returns ``block_table (B, max_pages)`` (int64, unused entries -1) and
        ``lengths (B,)`` (int64). ``seqs`` is a sequence of ids (repeats allowed).
        """
        return self.pages.table(seqs)

    def gather(self, seq):
        """Sequence ``seq``'s keys and values, contiguous: ``(Hkv, L, d)``, ``(Hkv, L, dv)``."""
        seq = self.pages.check_seq(seq)
        pages = np.asarray(self.block_tables[seq], dtype=np.intp)  # (n_pages,)
        L, Hkv = self.lengths[seq], self.num_kv_heads
        K = np.moveaxis(self.k_pages[pages], 0, 1)  # (Hkv, n_pages, page_size, d), a copy
        V = np.moveaxis(self.v_pages[pages], 0, 1)  # (Hkv, n_pages, page_size, dv)
        return K.reshape(Hkv, -1, self.head_dim)[:, :L], V.reshape(Hkv, -1, self.head_dim_v)[:, :L]


def paged_attention(q, cache, seqs, *, causal="bottom_right", scale=None, return_lse=False):
    """Attention of ``Nq`` new queries per sequence to the sequences' cached keys and values.

    Args:
        q: ``(B, Hq, Nq, d)``, row ``b`` the queries of sequence ``seqs[b]``; ``Hq`` a multiple
            of the cache's ``Hkv`` (grouped-query attention, as in ``flashref.attention``).
        cache: a ``PagedKVCache``; seqs: ``B`` sequence ids of it (lengths may differ).
        causal: ``"bottom_right"`` (default): the queries are the last ``Nq`` tokens of each
            sequence, already appended, so query ``i`` sees keys ``j <= i + L - Nq`` for a
            sequence of length ``L`` (with ``Nq = 1``, decoding, every key). ``False``: every
            query sees every cached key. Top-left ``True`` is refused.
        scale, return_lse: as in ``flashref.attention``.

    Returns ``O (B, Hq, Nq, dv)``, or ``(O, lse)`` with ``lse (B, Hq, Nq)``. A query that
    sees no key (a sequence of length 0, or ``L < Nq`` bottom-right) gets zeros and
    ``lse = -inf``.
    """
    causal = causal_bottom_right(causal, "paged_attention")  # top-left would hide the cache
    check_flag(return_lse, "return_lse")
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    q = as_float_array(q, "q")
    if q.ndim != 4 or q.shape[-1] != cache.head_dim:
        raise ValueError(
            f"q has shape {q.shape}; expected (B, Hq, Nq, d) with the cache's head dim "
            f"d = {cache.head_dim}"
        )
    B, Hq, Nq, _ = q.shape
    Hkv, ps, dv = cache.num_kv_heads, cache.page_size, cache.head_dim_v
    G = group_size(Hq, Hkv, f" (q {q.shape})", kv="the cache")
    table, lengths = cache.block_table(seqs)  # (B, max_pages), (B,): checks every id
    if len(lengths) != B:
        raise ValueError(f"q has {B} sequences (axis 0) but seqs has {len(lengths)}")
    out_dtype = np.result_type(q.dtype, cache.dtype)
    acc = accumulation_dtype(out_dtype)
    scale = acc.type(check_scale(scale, cache.head_dim, acc))

    O = np.empty((B, Hq, Nq, dv), dtype=acc)  # (B, Hq, Nq, dv)
    lse = np.empty((B, Hq, Nq), dtype=acc)  # (B, Hq, Nq)
    rows = range(Nq)
    for b, L in enumerate(lengths):  # on a GPU: one block per (sequence, K/V head, split)
        Qb = pack_heads(load_tile(q[b], rows, acc, scale), G)  # (Hkv, G * Nq, d), scaled
        state = SoftmaxState.empty((Hkv, G * Nq), dv, acc)
        positions = range(L - Nq, L)  # where the queries sit in the sequence (bottom-right)
        for p in range(-(-L // ps)):  # the pages in use, in block-table order
            page, cols = table[b, p], range(p * ps, min(L, (p + 1) * ps))  # cols: positions
            n = len(cols)  # filled slots: all but (perhaps) on the last page
            Kp = cache.k_pages[page, :, :n].astype(acc, copy=False)  # (Hkv, n, d)
            Vp = cache.v_pages[page, :, :n].astype(acc, copy=False)  # (Hkv, n, dv)
            S = Qb @ np.swapaxes(Kp, -1, -2)  # (Hkv, G * Nq, n)
            allowed = allowed_pairs(None, causal, positions, cols, G)  # key j <= i + L - Nq
            if allowed is not None:
                S = np.where(allowed, S, -np.inf)
            state = state.update(S, Vp)
        store_tile(O[b], lse[b], rows, state)
    return finish_output(O, lse, out_dtype, return_lse)
