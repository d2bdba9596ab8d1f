"""check_tiled_attention tells a right answer that did not tile: its peak memory shows it."""

from __future__ import annotations

import tracemalloc

import pytest
from attention_solutions import naive, query_strips, tiled_correct, tiled_loop

import flashref
from flashref.exercises import check_tiled_attention
from flashref.exercises.attention import NOT_TILED, UNTILED_KEYS


def test_tiled_tells_a_right_answer_that_built_the_whole_score_matrix():
    result = check_tiled_attention(naive)
    assert not result and len(result.failures) == 1 and result.cases_run == 15
    failure = result.failures[0]
    assert failure.case.startswith("a long sequence, peak memory measured: q (2048, 16)")
    assert failure.problem.startswith("the output is right, but the call's peak memory was ")
    assert "the (2048, 2048) score matrix alone is 32 MiB" in failure.problem
    assert (
        failure.diagnosis == NOT_TILED == ("not tiled: the whole (Nq, Nk) score matrix was built")
    )


def test_tiled_tells_flashref_naive_attention_too():
    def library_naive(q, k, v, block_q, block_k, causal):
        return flashref.naive_attention(q, k, v, causal=causal)

    result = check_tiled_attention(library_naive)
    assert [f.diagnosis for f in result.failures] == [NOT_TILED]


def test_tiled_tells_scores_for_every_key_at_once():
    result = check_tiled_attention(query_strips)
    assert [f.diagnosis for f in result.failures] == [UNTILED_KEYS], str(result)


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
    assert result.cases_run == 15


def test_the_memory_case_works_under_an_outer_trace():
    tracemalloc.start()
    try:
        assert not check_tiled_attention(naive)
        assert check_tiled_attention(tiled_loop("correct"))
        assert tracemalloc.is_tracing()  # the outer trace is left running
    finally:
        tracemalloc.stop()
