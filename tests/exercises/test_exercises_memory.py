"""check_tiled_attention tells a right answer that did not tile: its peak memory shows it."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from attention_solutions import naive, query_strips, tiled_correct, tiled_loop

import flashref
from flashref.exercises import check_tiled_attention
from flashref.exercises.attention import NOT_TILED, UNTILED_KEYS, UNTILED_QUERIES


def test_tiled_tells_a_right_answer_that_built_the_whole_score_matrix():
    result = check_tiled_attention(naive)
    assert not result and len(result.failures) == 2 and result.cases_run == 16
    failure = result.failures[0]
    assert failure.case.startswith(
        "a long sequence, peak memory measured, tall tiles: q (2048, 16)"
    )
    assert failure.problem.startswith("the output is right, but the call's peak memory was ")
    assert "the (2048, 2048) score matrix alone is 32 MiB" in failure.problem
    assert (
        failure.diagnosis == NOT_TILED == ("not tiled: the whole (Nq, Nk) score matrix was built")
    )


def test_tiled_tells_flashref_naive_attention_too():
    def library_naive(q, k, v, block_q, block_k, causal):
        return flashref.naive_attention(q, k, v, causal=causal)

    result = check_tiled_attention(library_naive)
    assert [f.diagnosis for f in result.failures] == [NOT_TILED, NOT_TILED]


def test_tiled_tells_scores_for_every_key_at_once():
    """Query tiles against every key at once, (block_q, Nk) strips: the tall tiles show it,
    however tidy the strip (one array, P computed in place)."""
    result = check_tiled_attention(query_strips)
    assert [f.diagnosis for f in result.failures] == [UNTILED_KEYS], str(result)
    assert result.failures[0].case.startswith("a long sequence, peak memory measured, tall tiles")

    def tidy_strips(q, k, v, block_q, block_k, causal):
        O = np.empty((len(q), v.shape[1]))
        for r in range(0, len(q), block_q):
            S = q[r : r + block_q] @ k.T  # (Br, Nk), the one strip
            S *= 1 / np.sqrt(q.shape[1])
            if causal:
                S[np.arange(len(k)) > np.arange(r, r + len(S))[:, None]] = -np.inf
            S -= S.max(axis=1, keepdims=True)
            np.exp(S, out=S)
            O[r : r + block_q] = S @ v / S.sum(axis=1, keepdims=True)
        return O

    result = check_tiled_attention(tidy_strips)
    assert [f.diagnosis for f in result.failures] == [UNTILED_KEYS], str(result)


def test_tiled_tells_scores_for_every_query_at_once():
    """Key tiles against every query at once (Algorithm 1's order without query tiles):
    (Nq, block_k) strips, which the wide tiles show."""

    def key_strips(q, k, v, block_q, block_k, causal):
        return flashref.tiled_attention_kv_outer(
            q, k, v, block_q=len(q), block_k=block_k, causal=causal
        )

    result = check_tiled_attention(key_strips)
    assert [f.diagnosis for f in result.failures] == [UNTILED_QUERIES], str(result)
    assert result.failures[0].case.startswith("a long sequence, peak memory measured, wide tiles")


def _mib(result) -> float:
    return float(result.failures[0].problem.split("peak memory was ")[1].split(" MiB")[0])


def test_the_measurement_cannot_be_switched_off():
    """A right answer that builds the whole score matrix and then stops tracemalloc, resets
    its peak (by the module or by a name of its own) or clears its traces is not a peak of 0:
    the checker says it cannot measure, or still sees the peak; it never passes."""
    from tracemalloc import reset_peak as own_reset_peak

    def stopping(q, k, v, block_q, block_k, causal):
        O = naive(q, k, v, block_q, block_k, causal)
        tracemalloc.stop()
        return O

    def resetting(q, k, v, block_q, block_k, causal):
        O = naive(q, k, v, block_q, block_k, causal)
        tracemalloc.reset_peak()
        tracemalloc.clear_traces()
        return O

    def resetting_by_own_name(q, k, v, block_q, block_k, causal):
        O = naive(q, k, v, block_q, block_k, causal)
        own_reset_peak()  # not the module's attribute: the sampled peak still sees S
        return O

    for fn, want in ((stopping, "tracemalloc.stop()"), (resetting, "tracemalloc.reset_peak()")):
        result = check_tiled_attention(fn)
        assert not result and len(result.failures) == 2, str(result)
        for f in result.failures:
            assert f.problem.startswith(
                f"cannot measure the peak memory: the function called {want}"
            )
            assert f.diagnosis is None
    result = check_tiled_attention(resetting_by_own_name)
    assert [f.diagnosis for f in result.failures] == [NOT_TILED, NOT_TILED], str(result)
    assert _mib(result) >= 32
    assert tracemalloc.stop is not None and not tracemalloc.is_tracing()  # all put back


def test_memory_tracemalloc_cannot_see_is_refused(monkeypatch):
    """A right answer computed by a library whose arrays live outside Python's allocator
    (torch, CuPy, JAX) reads as almost no memory: the checker says it cannot measure."""
    import sys
    import types

    fake = types.ModuleType("torch")
    exec(  # a function of a module named torch, as torch.nn.functional's Python functions are
        "def scaled_dot_product_attention(attention, *args):\n    return attention(*args)\n",
        fake.__dict__,
    )
    monkeypatch.setitem(sys.modules, "torch", fake)

    def by_torch(q, k, v, block_q, block_k, causal):
        return fake.scaled_dot_product_attention(naive, q, k, v, block_q, block_k, causal)

    result = check_tiled_attention(by_torch)
    assert not result and len(result.failures) == 2, str(result)
    for f in result.failures:
        assert f.problem.startswith("cannot measure the peak memory: the function called torch")
        assert "tracemalloc does not see; write the tile loop with NumPy" in f.problem


@pytest.mark.parametrize(
    "solution",
    [
        tiled_correct,
        tiled_loop("correct"),
        lambda q, k, v, bq, bk, c: flashref.tiled_attention(
            q, k, v, block_q=bq, block_k=bk, causal=c
        ),
        lambda q, k, v, bq, bk, c: flashref.tiled_attention_kv_outer(
            q, k, v, block_q=bq, block_k=bk, causal=c
        ),
    ],
    ids=["kv_outer_normalised", "fa2_loop", "flashref", "flashref_kv_outer"],
)
def test_tiled_solutions_stay_within_the_memory_budget(solution):
    result = check_tiled_attention(solution)
    assert result, str(result)
    assert result.cases_run == 16


def test_the_memory_case_works_under_an_outer_trace():
    tracemalloc.start()
    try:
        assert not check_tiled_attention(naive)
        assert check_tiled_attention(tiled_loop("correct"))
        assert tracemalloc.is_tracing()  # the outer trace is left running
    finally:
        tracemalloc.stop()


def test_memory_of_another_process_is_refused():
    """A right answer computed in another process (a ProcessPoolExecutor's worker) reads as
    almost no memory here: the checker says it cannot measure, naming the call."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:

        def elsewhere(q, k, v, block_q, block_k, causal):
            return pool.submit(flashref.naive_attention, q, k, v, causal=causal).result()

        result = check_tiled_attention(elsewhere)
    assert not result and len(result.failures) == 2, str(result)
    for f in result.failures:
        assert f.problem.startswith(
            "cannot measure the peak memory: the function called concurrent.futures.process"
        ), f.problem
        assert "runs code in another process" in f.problem
