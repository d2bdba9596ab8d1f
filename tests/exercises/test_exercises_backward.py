"""The backward-pass checkers accept correct solutions and name planted mistakes.

The solutions here are written the way a reader might write them, independently of
flashref's code and of the checker's simulations: one tile's D and dS from the formulas,
a tiled backward with key/value tiles outside (with a switch for each planted mistake),
one with query tiles outside, and untiled ones for the memory case.
"""

from __future__ import annotations

import numpy as np
import pytest

from flashref.exercises import _backward_mistakes as m
from flashref.exercises import check_backward_tile, check_tiled_backward
from flashref.exercises._report import NOT_IMPLEMENTED, PRECISION
from flashref.exercises.attention import BOTTOM_RIGHT, NO_CAUSAL, OFF_BY_ONE, STRICT_CAUSAL
from flashref.exercises.backward import (
    NOT_TILED,
    TOL,
    UNTILED_QUERIES,
    _tile_case,
    _tiled_case,
    tile_cases,
    tiled_cases,
)


def flat(result) -> str:
    """A report on one line: a long mistake name is wrapped over two lines when printed."""
    return " ".join(str(result).split())


# ---------------------------------------------------------------------------
# One tile: fn(Qi, Kj, Vj, Oi, dOi, lse_i) -> (D (Br,), dS (Br, Bc))


def tile(rule="correct"):
    def fn(Qi, Kj, Vj, Oi, dOi, lse_i):
        S = Qi @ Kj.T / (1.0 if rule == "no_scale" else np.sqrt(Qi.shape[1]))  # (Br, Bc)
        if rule == "no_lse":
            P = np.exp(S)
        elif rule == "tile_softmax":
            P = np.exp(S - S.max(axis=1, keepdims=True))
            P /= P.sum(axis=1, keepdims=True)
        else:
            P = np.exp(S - lse_i[:, None])
        dP = (Oi if rule == "dp_from_o" else dOi) @ Vj.T  # (Br, Bc)
        D = {
            "d_o_o": lambda: np.sum(Oi**2, axis=1),
            "d_do_do": lambda: np.einsum("ij,ij->i", dOi, dOi),
            "d_tile": lambda: np.sum(P * dP, axis=1),
        }.get(rule, lambda: np.einsum("ij,ij->i", dOi, Oi))()
        if rule == "no_d":
            return D, P * dP
        if rule == "no_p":
            return D, dP - D[:, None]
        return D, P * (dP - D[:, None])

    return fn


def test_tile_accepts_a_correct_solution():
    result = check_backward_tile(tile())
    assert result, str(result)
    assert result.cases_run == 10 and str(result) == "check_backward_tile: all 10 cases passed"


@pytest.mark.parametrize(
    "rule, name",
    [
        ("no_scale", m.NO_SCALE_S),
        ("no_lse", m.NO_LSE),
        ("tile_softmax", m.TILE_SOFTMAX),
        ("dp_from_o", m.DP_FROM_O),
        ("d_o_o", m.D_WRONG_ARRAYS),
        ("d_do_do", m.D_WRONG_ARRAYS),
        ("d_tile", m.D_ONE_TILE),
        ("no_d", m.NO_D),
        ("no_p", m.NO_P),
    ],
)
def test_tile_names_planted_mistake(rule, name):
    with np.errstate(all="ignore"):  # exp(S) overflows near 1000, on purpose
        result = check_backward_tile(tile(rule))
    report = flat(result)
    assert not result
    assert f"likely mistake: {name}" in report, report
    assert "expected" in report and "got" in report and "keys" in report
    diagnosed = [f.diagnosis for f in result.failures if f.diagnosis]
    assert diagnosed and all(name in d for d in diagnosed), diagnosed


def test_tile_d_from_one_tile_is_right_when_the_tile_holds_every_key():
    # The mistake is invisible there, and the checker must not call it wrong.
    result = check_backward_tile(tile("d_tile"))
    failed = {f.case.split(":")[0] for f in result.failures}
    assert "the tile holds every key" not in failed and len(failed) >= 5, failed


def test_tile_reports_the_wrong_part():
    def wrong_d_only(*args):
        D, dS = tile()(*args)
        return D + 1.0, dS

    report = str(check_backward_tile(wrong_d_only))
    assert "- a tile inside a longer row" in report and "D, element 0: expected" in report

    def nan_in_ds(*args):
        D, dS = tile()(*args)
        dS[-1, -1] = np.nan
        return D, dS

    result = check_backward_tile(nan_in_ds)
    assert not result and result.failures[0].diagnosis is None
    assert "dS, row 7 (the first wrong row), column 15: expected" in result.failures[0].problem


def test_tile_answer_rules():
    for answer, text in [
        (None, "returned None"),
        ([np.zeros(3), np.zeros((3, 2))], "expected a tuple (D, dS), got list"),
        ((np.zeros(8),), "expected a tuple (D, dS) of 2 arrays, got 1 values"),
        ((np.zeros(8), [[0.0]]), "dS: expected a numpy array, got a list"),
        ((np.zeros(7), np.zeros((8, 16))), "D: expected shape (8,), got shape (7,)"),
    ]:
        result = check_backward_tile(lambda *args, a=answer: a)
        assert not result and text in str(result), (text, str(result))
    masked = check_backward_tile(lambda *a: tuple(np.ma.masked_all_like(x) for x in tile()(*a)))
    assert "D: expected a plain numpy array, got a numpy.ma.MaskedArray" in str(masked)


def test_tile_not_implemented_and_non_callable():
    def stub(Qi, Kj, Vj, Oi, dOi, lse_i):
        raise NotImplementedError

    assert str(check_backward_tile(stub)) == (
        f"check_backward_tile: {NOT_IMPLEMENTED} (all 10 cases raised NotImplementedError)"
    )
    with pytest.raises(TypeError, match="fn must be a function"):
        check_backward_tile("D, dS")


# ---------------------------------------------------------------------------
# Tiled: fn(q, k, v, o, lse, do, block_q, block_k, causal) -> (dq, dk, dv)


def kv_outer(rule="correct"):
    """Key/value tiles outside, query tiles inside, with one planted mistake."""

    def fn(q, k, v, o, lse, do, block_q, block_k, causal):
        Nq, Nk = len(q), len(k)
        scale = 1 / np.sqrt(q.shape[1])
        D = np.sum((o if rule == "d_o_o" else do) * o, axis=1)  # (Nq,)
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        k_stop = Nk - Nk % block_k if rule == "drop_tail" else Nk
        for c0 in range(0, k_stop, block_k):
            c1 = min(c0 + block_k, Nk)
            Kj, Vj = k[c0:c1], v[c0:c1]  # (Bc, d), (Bc, dv)
            dKj, dVj = np.zeros_like(Kj), np.zeros_like(Vj)
            for r0 in range(0, Nq, block_q):
                r1 = min(r0 + block_q, Nq)
                if causal and rule != "no_skip":
                    last = r0 if rule in ("skip_first_row", "skip_diagonal") else r1 - 1
                    key = c1 - 1 if rule in ("skip_last_key", "skip_diagonal") else c0
                    if key > last:
                        continue  # every key after every query: fully masked
                Qi = q[r0:r1] * scale  # (Br, d), scaled once
                dOi = do[r0:r1]  # (Br, dv)
                S = Qi @ Kj.T  # (Br, Bc)
                if causal and rule != "no_mask":
                    i, j = np.arange(r0, r1)[:, None], np.arange(c0, c1)
                    allowed = j <= i + (Nk - Nq if rule == "bottom_right" else 0)
                    S = np.where(j < i if rule == "strict" else allowed, S, -np.inf)
                P = np.exp(S if rule == "no_lse" else S - lse[r0:r1, None])  # (Br, Bc)
                dP = dOi @ Vj.T  # (Br, Bc)
                Di = np.sum(P * dP, axis=1) if rule == "d_tile" else D[r0:r1]
                dS = P * (dP - Di[:, None])  # (Br, Bc)
                dVj += (P if rule == "transpose_dv" else P.T) @ dOi
                if rule == "transpose_dk":
                    dKj += dS @ Qi
                elif rule == "no_scale_dk":
                    dKj += dS.T @ q[r0:r1]
                elif rule == "twice_scale_dk":
                    dKj += scale * (dS.T @ Qi)
                else:
                    dKj += dS.T @ Qi
                dS_q = dS.T if rule == "transpose_dq" else dS
                part = (dS_q if rule == "no_scale_dq" else scale * dS_q) @ Kj  # (Br, d)
                if rule == "overwrite_dq":
                    dq[r0:r1] = part
                else:
                    dq[r0:r1] += part
                if rule == "overwrite_dkdv":  # the running sums thrown away each tile
                    dk[c0:c1], dv[c0:c1] = dKj, dVj
                    dKj, dVj = np.zeros_like(Kj), np.zeros_like(Vj)
            if rule != "overwrite_dkdv":
                dk[c0:c1], dv[c0:c1] = dKj, dVj
        return dq, dk, dv

    return fn


def q_outer(q, k, v, o, lse, do, block_q, block_k, causal):
    """Query tiles outside (dQ_i stays put, dK and dV summed in place), written separately."""
    Nq, Nk, d = len(q), len(k), q.shape[1]
    dq, dk, dv = np.zeros((Nq, d)), np.zeros((Nk, d)), np.zeros(v.shape)
    for r0 in range(0, Nq, block_q):
        rows = np.arange(r0, min(r0 + block_q, Nq))
        Di = np.einsum("ij,ij->i", do[rows], o[rows])  # (Br,)
        k_end = min(Nk, rows[-1] + 1) if causal else Nk  # later key tiles are fully masked
        for c0 in range(0, k_end, block_k):
            cols = np.arange(c0, min(c0 + block_k, k_end))
            S = q[rows] @ k[cols].T / np.sqrt(d)  # (Br, Bc)
            if causal:
                S[cols[None, :] > rows[:, None]] = -np.inf
            P = np.exp(S - lse[rows][:, None])
            dS = P * (do[rows] @ v[cols].T - Di[:, None])  # (Br, Bc)
            dq[rows] += dS @ k[cols] / np.sqrt(d)
            dk[cols] += dS.T @ q[rows] / np.sqrt(d)
            dv[cols] += P.T @ do[rows]
    return dq, dk, dv


def test_tiled_accepts_correct_solutions():
    for fn in (kv_outer(), q_outer):
        result = check_tiled_backward(fn)
        assert result, str(result)
        assert result.cases_run == 16


@pytest.mark.parametrize(
    "rule, name",
    [
        ("no_scale_dq", m.NO_SCALE_DQ),
        ("no_scale_dk", m.NO_SCALE_DK),
        ("twice_scale_dk", m.TWICE_SCALE_DK),
        ("d_o_o", m.D_WRONG_ARRAYS),
        ("d_tile", m.D_ONE_TILE),
        ("no_lse", m.NO_LSE),
        ("transpose_dq", m.TRANSPOSE_DQ),
        ("transpose_dk", m.TRANSPOSE_DK),
        ("transpose_dv", m.TRANSPOSE_DV),
        ("overwrite_dq", m.DQ_OVERWRITTEN),
        ("overwrite_dkdv", m.DKDV_OVERWRITTEN),
        ("drop_tail", OFF_BY_ONE),
        ("no_skip", m.NO_SKIP),
        ("skip_first_row", m.WRONG_SKIP),
        ("skip_last_key", m.WRONG_SKIP),
        ("skip_diagonal", m.WRONG_SKIP),
        ("no_mask", NO_CAUSAL),
        ("bottom_right", BOTTOM_RIGHT),
        ("strict", STRICT_CAUSAL),
    ],
)
def test_tiled_names_planted_mistake(rule, name):
    with np.errstate(all="ignore"):  # exp(S) overflows, NaN keys spread: on purpose
        result = check_tiled_backward(kv_outer(rule))
    report = flat(result)
    assert not result
    assert f"likely mistake: {name}" in report, report
    assert "block_q=" in report and "causal=" in report and "expected" in report
    diagnosed = [f.diagnosis for f in result.failures if f.diagnosis]
    assert all(name in d for d in diagnosed), diagnosed


def test_a_transpose_that_does_not_fit_is_reported_as_raised():
    # dS @ Qi needs Br == Bc: elsewhere the reader's code raises, and the report says so.
    result = check_tiled_backward(kv_outer("transpose_dk"))
    assert any("raised ValueError" in f.problem for f in result.failures), str(result)


def test_not_skipping_fails_only_the_case_with_nan_keys():
    with np.errstate(all="ignore"):
        result = check_tiled_backward(kv_outer("no_skip"))
    assert [f.case.split(":")[0] for f in result.failures] == ["Nq < Nk, keys 32-49 NaN"]
    assert "got nan" in str(result)


def test_untiled_solutions_fail_the_memory_case():
    def whole(q, k, v, o, lse, do, block_q, block_k, causal):
        return kv_outer()(q, k, v, o, lse, do, len(q), len(k), causal)  # one tile: (Nq, Nk)

    def key_strips(q, k, v, o, lse, do, block_q, block_k, causal):
        return kv_outer()(q, k, v, o, lse, do, len(q), block_k, causal)  # (Nq, Bc) strips

    for fn, diagnoses in ((whole, [NOT_TILED] * 2), (key_strips, [UNTILED_QUERIES])):
        with np.errstate(all="ignore"):  # one tile takes in the NaN keys of a causal case
            result = check_tiled_backward(fn)
        long = [f for f in result.failures if f.case.startswith("a long sequence")]
        assert [f.diagnosis for f in long] == diagnoses, str(result)
        assert "the gradients are right, but the call's peak memory was" in long[0].problem
    assert long[0].case.startswith("a long sequence, peak memory measured, wide tiles")


def in_float32(solution):
    def fn(q, k, v, o, lse, do, block_q, block_k, causal):
        arrays = (a.astype(np.float32) for a in (q, k, v, o, lse, do))
        return tuple(g.astype(np.float64) for g in solution(*arrays, block_q, block_k, causal))

    return fn


def test_a_float32_solution_is_told_precision():
    with np.errstate(all="ignore"):
        result = check_tiled_backward(in_float32(q_outer))
    assert not result
    assert all(f.case.startswith("scores near 1000") for f in result.failures), str(result)
    assert all(f.diagnosis == PRECISION for f in result.failures), str(result)


def test_tiled_answer_rules_and_stub():
    report = str(check_tiled_backward(lambda *args: q_outer(*args)[:2]))
    assert "expected a tuple (dq, dk, dv) of 3 arrays, got 2 values" in report

    def only_causal(q, k, v, o, lse, do, block_q, block_k, causal):
        if not causal:
            raise NotImplementedError
        return q_outer(q, k, v, o, lse, do, block_q, block_k, causal)

    result = check_tiled_backward(only_causal)
    assert all("causal=False" in f.case and f.problem == NOT_IMPLEMENTED for f in result.failures)
    assert len(result.failures) == 8  # 7 small cases and the tall-tiles memory case


@pytest.mark.parametrize(
    "make_case, cases, candidates",
    [
        (_tile_case, tile_cases, m.tile_candidates()),
        (_tiled_case, tiled_cases, m.backward_candidates(True)),
    ],
    ids=["tile", "tiled"],
)
def test_every_candidate_is_far_from_right_or_right(make_case, cases, candidates):
    # Simulated on every case, each candidate is either right to float64 rounding (the case
    # cannot expose it) or wrong by more than 1e-4 of its yardstick: never a hair away,
    # where float32 rounding could be mistaken for it; and on some case by more than 1e-2.
    worst = dict.fromkeys([name for name, _ in candidates], 0.0)
    for case in (make_case(*c) for c in cases()):
        for name, kwargs in case.wrong[0]:
            try:
                with np.errstate(all="ignore"):
                    error = case.distance(case.wrong[1](**kwargs)) * TOL  # relative
            except ValueError:  # a transpose that does not fit these shapes
                continue
            assert error < 1e-12 or error > 1e-4, (name, kwargs, case.label, error)
            worst[name] = max(worst[name], error)
    assert all(error > 1e-2 for error in worst.values()), worst


def test_the_checkers_are_listed_with_the_others():
    import flashref.exercises

    listed = dir(flashref.exercises)
    assert "check_backward_tile" in listed and "check_tiled_backward" in listed


def test_a_float32_tile_is_told_precision():
    def in_float32(*args):
        return tuple(x.astype(np.float64) for x in tile()(*(a.astype(np.float32) for a in args)))

    with np.errstate(all="ignore"):
        result = check_backward_tile(in_float32)
    assert not result
    assert all(f.case.startswith("scores near") for f in result.failures), str(result)
    assert all(f.diagnosis == PRECISION for f in result.failures), str(result)
