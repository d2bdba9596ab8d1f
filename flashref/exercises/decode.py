"""Checkers for the inference chapter: the combine step, the GQA head mapping, a paged read.

``check_combine_splits(fn)`` runs ``fn(O_s, lse_s)`` with the partial results of ``S``
splits of the keys, ``O_s (S, R, dv)`` and ``lse_s (S, R)`` (float64, one row per
query and head), and wants their merge ``(O, lse)``: ``O (R, dv)``, ``lse (R,)``, with
``lse = log(sum_s exp(lse_s))`` and ``O = sum_s exp(lse_s - lse) O_s``, computed so that
nothing overflows. A split with no visible key has ``lse_s = -inf`` and ``O_s = 0``
and must change nothing; a row whose splits are all empty gives ``O = 0`` and
``lse = -inf``.

``check_gqa_heads(fn)`` runs ``fn(Hq, Hkv)`` and wants the K/V head that each query head
reads under grouped-query attention, an int array ``(Hq,)``: ``h // G`` with
``G = Hq // Hkv`` (``Hkv = 1`` is multi-query attention, ``Hkv = Hq`` ordinary
multi-head attention).

``check_paged_gather(fn)`` runs ``fn(k_pages, block_table, length)`` with a pool
``k_pages (num_pages, Hkv, page_size, d)``, one sequence's row of
``PagedKVCache.block_table`` (its pages in order, padded with -1) and its length, and
wants the sequence's keys in order, ``(Hkv, length, d)`` in the pool's dtype: token
``t`` is slot ``t % page_size`` of page ``block_table[t // page_size]``.

Heads and keys are compared exactly (a gather copies; it does not round). The
combine's ``O`` is judged against ``TOL x max|O_s|`` (it is a convex combination of
the splits' outputs) and its ``lse`` against ``TOL`` absolute (an error ``e`` in an
``lse`` scales a weight by ``exp(e)``). ``TOL`` is the attention checkers': a float64
answer lands within ~1e-13, a float32 one misses on the case whose ``lse`` is near
1000 and is called float32 precision, and every mistake of ``_decode_mistakes`` misses
by more than 0.1, or gives NaN, on a case that exposes it
(``tests/exercises/test_exercises_decode.py`` plants each one).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..decode import split_kv_attention
from ..kvcache import PagedKVCache
from . import _decode_mistakes as dm
from ._answer import (
    TIGHT,
    excess,
    first_wrong_o_lse,
    not_an_array,
    o_lse_answer,
)
from ._report import CheckResult
from ._run import Case, check_callable, checker, float32_band, run
from .attention import TOL
from .ring import name_mistakes

__all__ = ["check_combine_splits", "check_gqa_heads", "check_paged_gather"]


# --- the combine step -------------------------------------------------------------------------


def _pair_answer(got, R, dv):
    """Accept a tuple ``(O (R, dv), lse (R,))`` of plain float arrays."""
    return o_lse_answer(got, R, dv, "the merged lse is part of the answer")


def _describe_combine(O_ref, lse_ref, lse_s, tols, value):
    """The first wrong row of O, or else of lse, with what its splits held."""
    S = lse_s.shape[0]

    def note(r):
        empty = int(np.isneginf(lse_s[:, r]).sum())
        return {0: "", S: f"all {S} splits of row {r} are empty; "}.get(
            empty, f"{empty} of the {S} splits of row {r} are empty; "
        )

    tol_text = {"O": f"{TOL:g} x max|O_s|", "lse": f"{TOL:g}"}
    return first_wrong_o_lse(O_ref, lse_ref, tols, value, tol_text, note)


def _combine_case(label, O_s, lse_s) -> Case:
    O_ref, lse_ref = dm.combine_reference(O_s, lse_s)
    S, R, dv = O_s.shape
    max_o = max(float(np.abs(O_s).max(initial=0.0)), 1.0)
    tols = (TOL * max_o, TOL)
    top = float(np.abs(lse_s[np.isfinite(lse_s)]).max(initial=0.0))
    magnitude = top + S  # what float32 rounds (see _run)
    tols32 = (float32_band(magnitude * max_o), float32_band(magnitude))

    def distance(value, tols=tols):
        return max(
            float(excess(e, g, t).max(initial=0.0))
            for e, g, t in zip((O_ref, lse_ref), value, tols, strict=True)
        )

    return Case(
        f"{label}: O_s {O_s.shape}, lse_s {lse_s.shape}",
        (O_s, lse_s),
        (O_ref, lse_ref),
        accept=lambda got: _pair_answer(got, R, dv),
        distance=distance,
        describe=lambda value: _describe_combine(O_ref, lse_ref, lse_s, tols, value),
        within_float32=lambda value: distance(value, tols32) <= 1,
        wrong=(lambda: dm.combine_candidates(O_s, lse_s), tols, distance),
    )


def _combine_mistakes(case, value) -> list[str]:
    """The combine mistakes whose (O, lse) equals the reader's, NaN matching NaN."""
    simulate, tols, distance = case.wrong

    def same(a, b, scale=1.0):
        return all(
            (excess(x, y, t * scale, nan_matches=True) <= 1).all()
            for x, y, t in zip(a, b, tols, strict=True)
        )

    names = []
    for name, O_c, lse_c in simulate():
        if name in names or not same((O_c, lse_c), value) or distance((O_c, lse_c)) <= 1:
            continue  # another answer, or not wrong on this case
        if same((O_c, lse_c), value, TIGHT / TOL) or not case.within_float32((O_c, lse_c)):
            names.append(name)
    return names


def _splits(rng, label, Hq, Hkv, Nq, Nk, d, S, **kwargs):
    """(label, O_s (S, R, dv), lse_s (S, R)) from split_kv_attention on random inputs."""
    q = rng.standard_normal((Hq, Nq, d))  # (Hq, Nq, d)
    k = rng.standard_normal((Hkv, Nk, d))  # (Hkv, Nk, d)
    v = rng.standard_normal((Hkv, Nk, 3))  # (Hkv, Nk, dv)
    _, splits = split_kv_attention(q, k, v, num_splits=S, return_splits=True, **kwargs)
    O_s = np.stack([s.O.reshape(Hq * Nq, -1) for s in splits])  # (S, R, dv)
    lse_s = np.stack([s.lse.reshape(Hq * Nq) for s in splits])  # (S, R)
    return label, O_s, lse_s


def _combine_cases():
    rng = np.random.default_rng(2026)
    cases = [
        _splits(rng, "one query, 4 heads, 4 splits of 16 keys", 4, 4, 1, 64, 8, 4),
        _splits(rng, "grouped heads (Hq 4, Hkv 2), 2 queries, 3 splits", 4, 2, 2, 50, 8, 3),
        _splits(rng, "one split", 2, 2, 1, 20, 8, 1),
        _splits(rng, "more splits than keys: 6 splits of 4 keys", 2, 2, 1, 4, 8, 6),
        _splits(
            rng, "causal, the later splits empty for early rows", 1, 1, 6, 6, 8, 3, causal=True
        ),
    ]
    mask = np.ones((2, 2, 40), dtype=bool)  # (Hq, Nq, Nk)
    mask[0, 1] = False  # one query may attend to no key at all
    mask[1, 0, :30] = False  # another only to the keys of the last split
    cases.append(_splits(rng, "a fully masked row", 2, 2, 2, 40, 8, 4, mask=mask))
    # Finished results as they come from elsewhere: lse near +1000 and -1000, and one split
    # that outweighs the others by exp(40).
    S, R, dv = 5, 6, 3
    O_s = rng.standard_normal((S, R, dv))
    for label, lse_s in [
        ("lse near 1000", 1000 + rng.normal(0, 3, (S, R))),
        ("lse near -1000", -1000 + rng.normal(0, 3, (S, R))),
        (
            "one split outweighs the rest",
            np.where(np.arange(S)[:, None] == 2, 40.0, 0.0) + rng.normal(0, 1, (S, R)),
        ),
    ]:
        cases.append((label, O_s, lse_s))
    return cases


@checker
def check_combine_splits(fn) -> CheckResult:
    """Check ``fn(O_s, lse_s) -> (O, lse)``: the combine step of split-KV decoding.

    See the module docstring. Cases: splits of single queries and of grouped heads,
    one split, more splits than keys (empty splits), causal rows whose later splits
    are empty, a fully masked row, lse near +1000 and -1000, one dominant split.
    """
    check_callable(fn, "fn(O_s, lse_s) -> (O, lse)")
    cases = [_combine_case(*case) for case in _combine_cases()]
    return run("check_combine_splits", fn, cases, partial(name_mistakes, matches=_combine_mistakes))


# --- the grouped-query head mapping ----------------------------------------------------------


def _heads_text(H) -> str:
    H = [int(h) for h in H]
    return " ".join(map(str, H)) if len(H) <= 12 else " ".join(map(str, H[:12])) + " ..."


def _heads_answer(got, Hq):
    if isinstance(got, tuple):
        return None, f"expected one array of K/V heads, got a tuple of {len(got)} values"
    problem = not_an_array(got, "the K/V heads")
    if problem:
        return None, problem
    if got.shape != (Hq,):
        return None, f"expected one K/V head per query head, shape ({Hq},), got {got.shape}"
    if got.dtype.kind not in "iu":
        return None, f"expected an integer array (heads index the K/V heads), got {got.dtype}"
    return got.astype(np.int64), None


def _head_mistakes(case, H) -> list[str]:
    names = []
    for name, candidate in case.wrong():
        wrong = not np.array_equal(candidate, case.expected)
        if wrong and np.array_equal(candidate, H) and name not in names:
            names.append(name)
    return names


# (Hq, Hkv): Llama-like 32 query heads on 8 K/V heads, small groups, multi-query (Hkv = 1),
# multi-head (Hkv = Hq), and shapes where h // Hkv and h % G differ from h // G.
HEADS = [(32, 8), (8, 2), (6, 3), (12, 4), (8, 1), (4, 4), (6, 2), (1, 1)]


@checker
def check_gqa_heads(fn) -> CheckResult:
    """Check ``fn(Hq, Hkv) -> heads (Hq,)``: the K/V head each query head reads (``h // G``)."""
    check_callable(fn, "fn(Hq, Hkv) -> K/V head of each query head")
    cases = []
    for Hq, Hkv in HEADS:
        expected = np.arange(Hq) // (Hq // Hkv)

        def describe(H, expected=expected):
            return f"expected {_heads_text(expected)}, got {_heads_text(H)}"

        cases.append(
            Case(
                f"Hq={Hq}, Hkv={Hkv} (G={Hq // Hkv})",
                (Hq, Hkv),
                expected,
                accept=lambda got, Hq=Hq: _heads_answer(got, Hq),
                distance=lambda H, e=expected: 0.0 if np.array_equal(H, e) else np.inf,
                describe=describe,
                within_float32=lambda H: False,  # integers: no rounding to blame
                wrong=lambda Hq=Hq, Hkv=Hkv: dm.head_candidates(Hq, Hkv),
            )
        )
    return run("check_gqa_heads", fn, cases, partial(name_mistakes, matches=_head_mistakes))


# --- reading a paged cache --------------------------------------------------------------------


def _pools():
    """Two paged caches whose sequences grew in turns, one freed and its pages reused.

    Returns ``[(cache, [seq, ...])]``. Pages of one sequence are neither adjacent nor in
    increasing order, and every written key is distinct, so a wrong one can be named.
    """
    rng = np.random.default_rng(2027)
    out = []
    for num_pages, ps, Hkv, d, growth in [
        (12, 4, 2, 3, [(0, 5), (1, 2), (2, 8), (0, 4), (3, 1), (1, 6), (0, 4), (2, 1)]),
        (8, 5, 1, 4, [(0, 3), (1, 10), (2, 5), (0, 9)]),
    ]:
        cache = PagedKVCache(num_pages, ps, Hkv, d, dtype=np.float32)
        seqs = [cache.new_sequence() for _ in range(max(s for s, _ in growth) + 2)]
        spare = cache.new_sequence()
        cache.append(spare, *(rng.standard_normal((2, Hkv, 2 * ps + 1, d), np.float32)))
        for s, n in growth:
            if s == 1 and spare in cache.lengths:  # its pages go back to the pool
                cache.free(spare)
            kv = rng.standard_normal((2, Hkv, n, d)).astype(np.float32)
            cache.append(seqs[s], kv[0], kv[1])
        out.append((cache, seqs))  # the last sequence stays empty: length 0, no pages
    return out


def _source(k_pages, h, key):
    """Where one head's key came from: ``page 7, slot 2`` (of head ``h`` or another)."""
    if not key.any():
        return "an empty slot (zeros)"
    hit = np.argwhere((k_pages == key).all(axis=-1))  # (hits, 3): page, head, slot
    if not len(hit):
        return "a key that is not in the pool"
    p, g, s = (int(x) for x in hit[0])
    return f"page {p}, slot {s}" + (f" of head {g}" if g != h else "")


def _describe_gather(k_pages, table, L, expected, K):
    ps = k_pages.shape[2]
    if K.shape[1] != L:
        n = -(-L // ps)
        return (
            f"expected {L} key{'s' * (L != 1)}, shape {expected.shape}, got {K.shape[1]}, "
            f"shape {K.shape}\n  the sequence uses {n} page{'s' * (n != 1)} of {ps} slots"
        )
    h, t = (int(x) for x in np.argwhere((K != expected).any(axis=2))[0])
    where = f"head {h}, position {t}: expected page {table[t // ps]}, slot {t % ps}"
    return f"{where} (block_table[{t // ps}]),\n  got {_source(k_pages, h, K[h, t])}"


def _gather_answer(got, Hkv, d, dtype):
    if isinstance(got, tuple):
        return None, f"expected one array K, got a tuple of {len(got)} values (return K alone)"
    problem = not_an_array(got, "K")
    if problem:
        return None, problem
    if got.ndim != 3 or got.shape[0] != Hkv or got.shape[2] != d:
        return None, f"expected shape (Hkv, length, d) = ({Hkv}, length, {d}), got {got.shape}"
    if got.dtype != dtype:
        return None, f"expected dtype {dtype} (the pool's: a gather copies), got {got.dtype}"
    return got, None


def _gather_mistakes(case, K) -> list[str]:
    names = []
    for name, candidate in case.wrong():
        if name in names or candidate.shape != K.shape or not np.array_equal(candidate, K):
            continue
        if candidate.shape != case.expected.shape or not np.array_equal(candidate, case.expected):
            names.append(name)
    return names


@checker
def check_paged_gather(fn) -> CheckResult:
    """Check ``fn(k_pages, block_table, length) -> K (Hkv, length, d)``: one sequence's keys.

    See the module docstring. Cases: sequences with a partly filled last page, with
    full pages only, of one token and of none, their pages scattered through the pool
    out of order, their block-table rows padded with -1.
    """
    check_callable(fn, "fn(k_pages, block_table, length) -> K")
    cases = []
    for cache, seqs in _pools():
        table, lengths = cache.block_table(seqs)  # (B, max_pages), (B,)
        k_pages, ps = cache.k_pages, cache.page_size
        Hkv, d = cache.num_kv_heads, cache.head_dim
        for b, seq in enumerate(seqs):
            row, L = table[b], int(lengths[b])
            expected = cache.gather(seq)[0]  # (Hkv, L, d)
            label = f"length {L}, page_size {ps}, block_table {row.tolist()}"
            cases.append(
                Case(
                    label,
                    (k_pages, row, L),
                    expected,
                    accept=partial(_gather_answer, Hkv=Hkv, d=d, dtype=k_pages.dtype),
                    distance=lambda K, e=expected: 0.0
                    if K.shape == e.shape and np.array_equal(K, e)
                    else np.inf,
                    describe=partial(_describe_gather, k_pages, row, L, expected),
                    within_float32=lambda K: False,  # copies: no rounding to blame
                    wrong=partial(dm.gather_candidates, k_pages, row, L),
                )
            )
    return run("check_paged_gather", fn, cases, partial(name_mistakes, matches=_gather_mistakes))
