"""Known-wrong answers to the decoding exercises, computed to name a reader's mistake.

``combine_candidates`` returns ``[(mistake name, O, lse)]`` for the combine step of
split-KV decoding: the weights taken without subtracting the largest ``lse``, the
``lse`` values themselves used as weights, a plain average, ``-inf - -inf`` left as
NaN for a row whose splits are all empty, the sum left undivided, and an ``lse``
without its maximum or equal to it. ``head_candidates`` returns ``[(mistake name,
heads)]`` for the grouped-query head mapping, and ``gather_candidates`` ``[(mistake
name, K)]`` for reading one sequence's keys out of a paged pool. Everything here is
float64 (or the pool's own dtype) and written literally, so a mistake's NaN is the NaN
a reader's code gives.
"""

from __future__ import annotations

import numpy as np

# --- the combine step --------------------------------------------------------------------------

NO_MAX = "weights exp(lse_s) without subtracting the largest lse first, which overflows"
LSE_WEIGHTS = "weighted by lse_s itself instead of exp(lse_s - max lse)"
AVERAGE = "the splits' outputs averaged, not weighted by exp(lse_s - max lse)"
EMPTY_NAN = (
    "NaN for a row whose splits are all empty: max lse is -inf and -inf - -inf is NaN; "
    "such a row gives O = 0 and lse = -inf"
)
UNNORMALISED = "the weighted sum not divided by the sum of the weights"
LSE_NO_MAX = "lse without the maximum: log(sum w) instead of max lse + log(sum w)"
LSE_IS_MAX = "the largest lse_s returned as lse, instead of max lse + log(sum w)"


def combine_reference(O_s, lse_s):
    """O (R, dv), lse (R,) merged from O_s (S, R, dv), lse_s (S, R); empty rows 0, -inf."""
    m = lse_s.max(axis=0)  # (R,)
    seen = np.isfinite(m)  # (R,) rows with a key in some split
    shift = np.where(seen, m, 0.0)
    w = np.exp(lse_s - shift)  # (S, R), 0 for empty splits
    total = w.sum(axis=0)  # (R,)
    O = np.einsum("sr,srd->rd", w, O_s)  # (R, dv)
    O = np.divide(O, total[:, None], out=np.zeros_like(O), where=seen[:, None])
    with np.errstate(divide="ignore"):
        lse = np.where(seen, shift + np.log(total), -np.inf)
    return O, lse


def combine_candidates(O_s, lse_s):
    """(name, O, lse) for every combine mistake (see the module docstring)."""
    O, lse = combine_reference(O_s, lse_s)
    m = lse_s.max(axis=0)  # (R,) -inf for rows whose splits are all empty
    seen = np.isfinite(m)
    out = []
    w = np.exp(lse_s)  # (S, R) no maximum subtracted: inf for lse above 709.78
    out.append(
        (NO_MAX, np.einsum("sr,srd->rd", w, O_s) / w.sum(axis=0)[:, None], np.log(w.sum(axis=0)))
    )
    w = np.where(np.isfinite(lse_s), lse_s, 0.0)  # (S, R) the lse itself as a weight
    out.append((LSE_WEIGHTS, np.einsum("sr,srd->rd", w, O_s) / w.sum(axis=0)[:, None], lse))
    out.append((AVERAGE, O_s.mean(axis=0), lse))
    w = np.exp(lse_s - m)  # (S, R) unguarded: NaN in rows whose splits are all empty
    total = w.sum(axis=0)
    O_nan = np.einsum("sr,srd->rd", w, O_s) / total[:, None]
    out.append((EMPTY_NAN, O_nan, m + np.log(total)))
    out.append((EMPTY_NAN, O_nan, lse))  # a guarded lse, an unguarded O
    w = np.exp(lse_s - np.where(seen, m, 0.0))
    total = w.sum(axis=0)
    out.append((UNNORMALISED, np.einsum("sr,srd->rd", w, O_s), lse))
    out.append((LSE_NO_MAX, O, np.where(seen, np.log(total), -np.inf)))
    out.append((LSE_IS_MAX, O, m))
    return out


# --- the grouped-query head mapping ------------------------------------------------------------

MODULO_HKV = (
    "h % Hkv: query heads dealt round-robin (as np.tile and tensor.repeat copy heads); "
    "each group of G consecutive query heads shares one K/V head"
)
MODULO_G = "h % G: the position inside the group, not the group's number h // G"
DIVIDE_BY_HKV = "h // Hkv: divided by the number of K/V heads, not by the group size G = Hq // Hkv"
DIVIDE_BY_HQ = "h * Hq // Hkv: the ratio upside down (G = Hq // Hkv query heads per K/V head)"


def head_candidates(Hq, Hkv):
    """(name, K/V head of every query head) for every mapping mistake."""
    h, G = np.arange(Hq), Hq // Hkv
    return [
        (MODULO_HKV, h % Hkv),
        (MODULO_G, h % G),
        (DIVIDE_BY_HKV, h // Hkv),
        (DIVIDE_BY_HQ, h * Hq // Hkv),
    ]


# --- reading a paged cache ---------------------------------------------------------------------

WHOLE_LAST_PAGE = (
    "every slot of the last page read: only length - (pages - 1) * page_size of them are filled"
)
PADDING_READ = (
    "the block table's -1 padding read as a page (k_pages[-1] is the pool's last page): "
    "the sequence has only ceil(length / page_size) pages"
)
LENGTH_SHORT = "one key short: positions 0 to length - 1 are length keys"
LENGTH_LONG = "one key too many: the slot after the last token is not filled"
PAGE_ORDER = "the pages in another order than the block table's (sorted or reversed)"
POOL_ORDER = "pages 0, 1, 2, ... of the pool read instead of the pages the block table names"
NO_MOVEAXIS = (
    "the gathered pages (pages, Hkv, page_size, d) reshaped without moving the head axis "
    "first: they must become (Hkv, pages * page_size, d)"
)


def _read(k_pages, pages, L):
    """The first L keys of ``pages`` read in order: (Hkv, L, d), or None if L is too long."""
    Hkv, ps, d = k_pages.shape[1:]
    if L < 0 or L > len(pages) * ps:
        return None
    K = np.moveaxis(k_pages[np.asarray(pages, dtype=np.intp)], 0, 1)  # (Hkv, n, ps, d)
    return K.reshape(Hkv, len(pages) * ps, d)[:, :L]


def gather_candidates(k_pages, block_table, length):
    """(name, K) for every paged-gather mistake; K in the pool's dtype."""
    ps = k_pages.shape[2]
    n = -(-length // ps)  # pages in use
    used = [int(p) for p in block_table[:n]]
    out = []
    for name, pages, L in [
        (WHOLE_LAST_PAGE, used, n * ps),
        (PADDING_READ, [int(p) for p in block_table], len(block_table) * ps),
        (LENGTH_SHORT, used, length - 1),
        (LENGTH_LONG, used, length + 1),
        (PAGE_ORDER, sorted(used), length),
        (PAGE_ORDER, used[::-1], length),
        (POOL_ORDER, list(range(n)), length),
    ]:
        K = _read(k_pages, pages, L)
        if K is not None:
            out.append((name, K))
    if n:
        Hkv, d = k_pages.shape[1], k_pages.shape[3]
        flat = k_pages[np.asarray(used, dtype=np.intp)].reshape(Hkv, -1, d)  # (Hkv, n*ps, d)
        out.append((NO_MOVEAXIS, flat[:, :length]))
    return out
