"""Packed (varlen) batches: each sequence attends to its own keys alone, forward and backward,
checked against the independent float64 references one sequence at a time; the offsets and
lengths are checked whole, each error naming the argument and the entry, before any work."""

from __future__ import annotations

import numpy as np
import pytest
from reference import (
    assert_close,
    assert_grads_close,
    attention_backward_gqa_ref,
    attention_gqa_ref,
    bottom_right_pairs,
    variant_attention_ref,
)

import flashref
from flashref.varlen import varlen_attention, varlen_attention_backward

# queries and keys per sequence: an empty one, one with keys but no queries, one whose queries
# see no key (no keys at all), one longer than a tile (64), one of a single token
LQ = [5, 0, 70, 1, 3, 9]
LK = [9, 3, 81, 1, 0, 9]
HQ, HKV, D, DV = 4, 2, 8, 6


def _offsets(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _packed(seed=0, lq=LQ, lk=LK):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((sum(lq), HQ, D))
    k = rng.standard_normal((sum(lk), HKV, D))
    v = rng.standard_normal((sum(lk), HKV, DV))
    return q, k, v, _offsets(lq), _offsets(lk)


def _mask(causal, Lq, Lk):
    if causal == "bottom_right":
        return bottom_right_pairs(Lq, Lk)
    if causal == "top_left":
        return np.tril(np.ones((Lq, Lk), bool))
    return None


def _sequence(x, cu, b, used=None):
    """Sequence b of a packed (total, H, w) array as (H, L, w)."""
    end = cu[b + 1] if used is None else cu[b] + used
    return np.swapaxes(x[cu[b] : end], 0, 1)


@pytest.mark.parametrize("causal", [False, "bottom_right", "top_left"])
def test_each_sequence_attends_to_its_own_keys_alone(causal):
    q, k, v, cq, ck = _packed()
    O, lse = varlen_attention(
        q, k, v, cq, ck, max(LQ), max(LK), causal=causal, return_lse=True, block_q=16, block_k=16
    )
    assert O.shape == (sum(LQ), HQ, DV) and lse.shape == (HQ, sum(LQ))
    for b in range(len(LQ)):
        mask = _mask(causal, LQ[b], LK[b])
        want, want_lse = attention_gqa_ref(
            *(_sequence(x, c, b) for x, c in ((q, cq), (k, ck), (v, ck))), mask=mask
        )
        assert_close(np.swapaxes(O[cq[b] : cq[b + 1]], 0, 1), want, 1e-12, f"O of sequence {b}")
        assert np.allclose(lse[:, cq[b] : cq[b + 1]], want_lse, rtol=1e-12, atol=0), b
    assert (O[cq[4] : cq[5]] == 0).all() and np.isneginf(lse[:, cq[4] : cq[5]]).all()


def test_one_length_is_the_dense_batch():
    """Sequences of one length: the packed call equals the dense batch (B, H, N, d)."""
    L, B = 24, 3
    q, k, v, cq, ck = _packed(1, [L] * B, [L] * B)
    O = varlen_attention(q, k, v, cq, ck, L, L, causal="top_left")
    dense = [np.swapaxes(x.reshape(B, L, x.shape[1], -1), 1, 2) for x in (q, k, v)]
    want = flashref.tiled_attention(*dense, causal=True)  # (B, H, L, dv)
    np.testing.assert_allclose(O, np.swapaxes(want, 1, 2).reshape(B * L, HQ, DV), rtol=1e-13)


def test_seqused_k_takes_each_sequences_first_keys():
    q, k, v, cq, ck = _packed(2)
    used = np.array([4, 0, 81, 1, 0, 2], np.int32)
    O = varlen_attention(q, k, v, cq, ck, 70, 81, causal="bottom_right", seqused_k=used)
    for b in range(len(LQ)):
        mask = _mask("bottom_right", LQ[b], int(used[b]))
        args = (_sequence(q, cq, b), _sequence(k, ck, b, used[b]), _sequence(v, ck, b, used[b]))
        want, _ = attention_gqa_ref(*args, mask=mask)
        assert_close(np.swapaxes(O[cq[b] : cq[b + 1]], 0, 1), want, 1e-12, f"sequence {b}")


@pytest.mark.parametrize("causal", [False, "bottom_right"])
def test_gradients_are_each_sequences_own(causal):
    q, k, v, cq, ck = _packed(3)
    used = np.array([9, 3, 60, 1, 0, 5], np.int32)
    O, lse = varlen_attention(
        q, k, v, cq, ck, 70, 81, causal=causal, seqused_k=used, return_lse=True
    )
    do = np.random.default_rng(4).standard_normal(O.shape)
    dq, dk, dv = varlen_attention_backward(
        q, k, v, O, lse, do, cq, ck, 70, 81, causal=causal, seqused_k=used, block_k=32
    )
    for b in range(len(LQ)):
        mask = _mask(causal, LQ[b], int(used[b]))
        args = (_sequence(q, cq, b), _sequence(k, ck, b, used[b]), _sequence(v, ck, b, used[b]))
        want, sizes = attention_backward_gqa_ref(*args, _sequence(do, cq, b), mask=mask)
        got = (
            _sequence(dq, cq, b),
            _sequence(dk, ck, b, used[b]),
            _sequence(dv, ck, b, used[b]),
        )
        assert_grads_close(got, want, sizes, 1e-10, f"gradients of sequence {b}")
        rest = slice(ck[b] + used[b], ck[b + 1])  # keys past seqused_k: no gradient
        assert (dk[rest] == 0).all() and (dv[rest] == 0).all()


def test_no_sequence_and_no_token():
    q, k, v = np.zeros((0, HQ, D)), np.zeros((0, HKV, D)), np.zeros((0, HKV, DV))
    O, lse = varlen_attention(q, k, v, [0], [0], 0, 0, return_lse=True)
    assert O.shape == (0, HQ, DV) and lse.shape == (HQ, 0)
    O, lse = varlen_attention(q, k, v, [0, 0, 0], [0, 0, 0], 0, 0, return_lse=True)
    assert O.shape == (0, HQ, DV)  # more sequences than tokens
    grads = varlen_attention_backward(q, k, v, O, lse, O, [0, 0, 0], [0, 0, 0], 0, 0)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def _bad(**change):
    q, k, v, cq, ck = _packed()
    args = {"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck}
    args |= {"max_seqlen_q": 70, "max_seqlen_k": 81}
    return args | change


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"cu_seqlens_q": [1, 5, 5, 75, 76, 79, 88]}, ValueError, r"cu_seqlens_q\[0\] is 1"),
        (
            {"cu_seqlens_q": [0, 5, 4, 75, 76, 79, 88]},
            ValueError,
            r"cu_seqlens_q\[2\] is 4, before cu_seqlens_q\[1\] = 5",
        ),
        (
            {"cu_seqlens_k": [0, 9, 12, 93, 94, 94, 100]},
            ValueError,
            r"cu_seqlens_k\[6\] is 100 but the packed tensor holds 103 tokens",
        ),
        ({"cu_seqlens_q": [0, 5, 5, 75, 76, 88]}, ValueError, r"cu_seqlens_q holds 5 sequences"),
        ({"cu_seqlens_q": np.array([0.0, 88.0])}, TypeError, r"cu_seqlens_q has dtype float64"),
        ({"cu_seqlens_k": np.zeros((2, 7), int)}, ValueError, r"cu_seqlens_k has shape \(2, 7\)"),
        (
            {"cu_seqlens_q": np.ma.masked_array(_offsets(LQ))},
            TypeError,
            "cu_seqlens_q is a numpy.ma.MaskedArray",
        ),
        ({"max_seqlen_q": 69}, ValueError, r"max_seqlen_q is 69 but sequence 2 has 70 queries"),
        ({"max_seqlen_k": 80.0}, TypeError, r"max_seqlen_k must be an int, got float"),
        ({"q": np.zeros((88, HQ))}, ValueError, r"q has shape \(88, 4\); expected \(total_q"),
        ({"v": np.zeros((102, HKV, DV))}, ValueError, r"v has shape \(102, 2, 6\) but k"),
        (
            {"k": np.zeros((103, 3, D)), "v": np.zeros((103, 3, DV))},
            ValueError,
            "q has 4 heads but k has 3",
        ),
        ({"seqused_k": [9, 3, 82, 1, 0, 9]}, ValueError, r"seqused_k\[2\] is 82; expected 0 <="),
        ({"seqused_k": [9, 3]}, ValueError, r"seqused_k has shape \(2,\); expected \(6,\)"),
        ({"causal": True}, ValueError, "causal=True does not say which mask"),
        ({"causal": "diagonal"}, ValueError, "causal must be"),
    ],
)
def test_bad_input_is_named_before_any_work(change, error, match):
    with pytest.raises(error, match=match):
        varlen_attention(**_bad(**change))
    args = _bad(**change)
    o = np.zeros((args["q"].shape[0], HQ, DV)) if args["q"].ndim == 3 else args["q"]
    lse = np.zeros((HQ, args["q"].shape[0]))
    with pytest.raises(error, match=match):
        varlen_attention_backward(args.pop("q"), args.pop("k"), args.pop("v"), o, lse, o, **args)


def test_the_backward_names_a_misshapen_output():
    q, k, v, cq, ck = _packed()
    O, lse = varlen_attention(q, k, v, cq, ck, 70, 81, return_lse=True)
    with pytest.raises(ValueError, match=r"lse has shape \(88, 4\); expected \(4, 88\)"):
        varlen_attention_backward(q, k, v, O, lse.T, O, cq, ck, 70, 81)
    with pytest.raises(ValueError, match=r"do has shape \(88, 4\); expected \(88, 4, 6\)"):
        varlen_attention_backward(q, k, v, O, lse, O[..., 0], cq, ck, 70, 81)


VARIANT = {
    "window": (5, 0),
    "softcap": 2.5,
    "alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625]),
    "sinks": np.array([0.0, 1.0, -np.inf, 0.5]),
}


def test_each_sequence_takes_the_variants_on_its_own_diagonal():
    """The window, softcap, ALiBi and sinks of flashref.variants, sequence by sequence, against
    the pair-by-pair float64 reference (the window and ALiBi on j = i + Lk - Lq)."""
    q, k, v, cq, ck = _packed(5)
    O, lse = varlen_attention(
        q, k, v, cq, ck, 70, 81, causal="bottom_right", return_lse=True, block_k=16, **VARIANT
    )
    for b in range(len(LQ)):
        args = [_sequence(x, c, b)[None] for x, c in ((q, cq), (k, ck), (v, ck))]
        want, want_lse = variant_attention_ref(
            *args,
            causal="bottom_right",
            window=VARIANT["window"],
            softcap=VARIANT["softcap"],
            alibi=VARIANT["alibi_slopes"],
            sinks=VARIANT["sinks"],
        )
        got = np.swapaxes(O[cq[b] : cq[b + 1]], 0, 1)
        np.testing.assert_allclose(got, want[0], rtol=0, atol=1e-12, err_msg=f"sequence {b}")
        np.testing.assert_allclose(lse[:, cq[b] : cq[b + 1]], want_lse[0], rtol=1e-12)


def test_the_sinks_gradient_sums_over_the_sequences():
    q, k, v, cq, ck = _packed(6)
    O, lse = varlen_attention(q, k, v, cq, ck, 70, 81, return_lse=True, **VARIANT)
    do = np.random.default_rng(7).standard_normal(O.shape)
    dq, dk, dv, dsinks = varlen_attention_backward(
        q, k, v, O, lse, do, cq, ck, 70, 81, block_q=32, **VARIANT
    )
    total = np.zeros(HQ)
    for b in range(len(LQ)):
        seq = [_sequence(x, c, b) for x, c in ((q, cq), (k, ck), (v, ck), (O, cq))]
        grads = flashref.naive_attention_backward(
            *seq, lse[:, cq[b] : cq[b + 1]], _sequence(do, cq, b), **VARIANT
        )
        np.testing.assert_allclose(_sequence(dq, cq, b), grads[0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(_sequence(dk, ck, b), grads[1], rtol=0, atol=1e-12)
        total += grads[3]
    np.testing.assert_allclose(dsinks, total, rtol=1e-12)
    assert dsinks[2] == 0  # the head without a sink
