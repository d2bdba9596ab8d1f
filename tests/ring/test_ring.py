"""ring_attention, its schedule, shard_positions and SoftmaxState.from_output."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    assert_close,
    attention_naive_lowp,
    attention_ref,
    causal_refusal,
    no_warnings,
    rel_error,
)

import flashref.ring
from flashref import (
    SoftmaxState,
    merge_states,
    naive_attention,
    ring_attention,
    shard_positions,
    tiled_attention,
)
from flashref._checks import check_flag

# float64 tolerance, as in test_attention.py: every output is a weighted average of at most
# 120 value rows with scores from dot products of length d <= 24, so the worst-case error is
# ~(N + d) units of roundoff, ~3e-14; the ring adds one merge per step (a rescaling by a
# rounded exp and a multiply-add: a few roundoffs each, at most 12 steps here). 1e-12 is
# above that and far below any real mistake (a block missed or seen twice, a wrong mask, a
# row written to the wrong position are all off by O(1)).
RTOL64 = 1e-12

rngs = st.integers(min_value=0, max_value=2**32 - 1).map(np.random.default_rng)


def qkv(rng, batch, N, d, dv, dtype=np.float64):
    q = rng.standard_normal(batch + (N, d)).astype(dtype)
    k = rng.standard_normal(batch + (N, d)).astype(dtype)
    v = rng.standard_normal(batch + (N, dv)).astype(dtype)
    return q, k, v


def unit(layout):
    """The sequence length must be a multiple of this many times world_size."""
    return 1 if layout == "contiguous" else 2


# ---- against the float64 oracle -------------------------------------------------------------

CASES = [  # (world_size, layout, batch, N, d, dv): shards of odd sizes, tiles that do not fit
    (1, "contiguous", (), 7, 3, 5),
    (1, "zigzag", (2,), 6, 4, 4),
    (2, "contiguous", (2, 3), 14, 5, 7),
    (2, "zigzag", (), 20, 8, 3),
    (3, "contiguous", (1,), 21, 16, 16),
    (3, "zigzag", (), 30, 6, 9),
    (4, "contiguous", (), 4, 2, 2),  # one position per device
    (4, "zigzag", (2,), 40, 24, 8),
    (5, "contiguous", (), 55, 7, 11),
    (6, "zigzag", (), 12, 4, 4),  # one position per chunk
    (8, "contiguous", (2,), 120, 8, 8),
]


@pytest.mark.parametrize("W, layout, batch, N, d, dv", CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_float64_matches_reference_and_naive(W, layout, batch, N, d, dv, causal):
    q, k, v = qkv(np.random.default_rng(100 * W + N), batch, N, d, dv)
    O_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    with no_warnings():
        O, lse = ring_attention(
            q,
            k,
            v,
            world_size=W,
            causal=causal,
            layout=layout,
            block_q=4,
            block_k=3,
            return_lse=True,
        )
        O_naive, lse_naive = naive_attention(q, k, v, causal=causal, return_lse=True)
    assert O.dtype == np.float64 and lse.dtype == np.float64
    assert_close(O, O_ref, RTOL64, "O vs reference")
    assert_close(lse, lse_ref, RTOL64, "lse vs reference")
    assert_close(O, O_naive, RTOL64, "O vs naive_attention")
    assert_close(lse, lse_naive, RTOL64, "lse vs naive_attention")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("W, layout", [(2, "contiguous"), (4, "zigzag"), (8, "contiguous")])
@pytest.mark.parametrize("causal", [False, True])
def test_low_precision_error_at_most_twice_naive(W, layout, causal, dtype):
    # The rule of test_attention.py: error against the float64 reference of the rounded
    # inputs at most ~2x that of the same-precision textbook formula, plus one unit
    # roundoff of the dtype for the final rounding (float16 accumulates in float32, and the
    # partial outputs travel in float32 too, so only that last rounding is in float16).
    q, k, v = qkv(np.random.default_rng(W), (2,), 96, 32, 16, dtype)
    O_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    O_low, lse_low = attention_naive_lowp(q, k, v, dtype, causal=causal)
    with no_warnings():
        O, lse = ring_attention(
            q, k, v, world_size=W, causal=causal, layout=layout, return_lse=True
        )
    assert O.dtype == dtype and lse.dtype == np.float32
    err, err_low = rel_error(O, O_ref), rel_error(O_low, O_ref)
    assert err <= 2 * err_low + np.finfo(dtype).eps, f"O error {err:.2e} vs naive {err_low:.2e}"
    err, err_low = rel_error(lse, lse_ref), rel_error(lse_low, lse_ref)
    assert err <= 2 * err_low + np.finfo(np.float32).eps, f"lse error {err:.2e} vs {err_low:.2e}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_one_device_is_tiled_attention_bitwise(layout, causal):
    # With W = 1 there is one step: tiled_attention on the whole sequence with the causal
    # mask written out, merged into an empty state. The key tiles that causal=True skips are
    # fully masked here, and those are exact no-ops of SoftmaxState.update (block_q is a
    # multiple of block_k, so the tiles both runs do compute are the same); merging into
    # the empty state multiplies by exp(0) = 1 and adds exp(-inf) * 0 = 0. So the result is
    # tiled_attention's to the last bit.
    q, k, v = qkv(np.random.default_rng(8), (2,), 30, 6, 5, np.float32)
    kw = dict(causal=causal, block_q=8, block_k=4, return_lse=True)
    O, lse = ring_attention(q, k, v, world_size=1, layout=layout, **kw)
    O_t, lse_t = tiled_attention(q, k, v, **kw)
    assert O.tobytes() == O_t.tobytes() and lse.tobytes() == lse_t.tobytes()


def test_empty_sequence_gives_empty_results():
    q, k, v = qkv(np.random.default_rng(0), (2,), 0, 4, 3)
    O, lse, schedule = ring_attention(
        q, k, v, world_size=3, layout="zigzag", causal=True, return_lse=True, return_schedule=True
    )
    assert O.shape == (2, 0, 3) and lse.shape == (2, 0)
    np.testing.assert_array_equal(schedule.pairs, np.zeros((3, 3)))


def test_return_values():
    q, k, v = qkv(np.random.default_rng(1), (), 8, 4, 2)
    O = ring_attention(q, k, v, world_size=2)
    assert isinstance(O, np.ndarray) and O.shape == (8, 2)
    O2, schedule = ring_attention(q, k, v, world_size=2, return_schedule=True)
    assert isinstance(schedule, flashref.ring.RingSchedule) and schedule.world_size == 2
    np.testing.assert_array_equal(O2, O)
    O3, lse, _ = ring_attention(q, k, v, world_size=2, return_lse=True, return_schedule=True)
    np.testing.assert_array_equal(O3, O)
    assert lse.shape == (8,)


# ---- properties (hypothesis) ------------------------------------------------------------------


@st.composite
def problems(draw):
    """A random problem: batch rank 0..2, world size 1..6, either layout, 1..7 positions
    per shard (1..7 per chunk for zigzag), d and dv from 1, causal or not, any tile sizes."""
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2), label="batch"))
    W = draw(st.integers(1, 6), label="world_size")
    layout = draw(st.sampled_from(["contiguous", "zigzag"]), label="layout")
    per_shard = draw(st.integers(1, 7), label="N / world_size") * unit(layout)
    d = draw(st.integers(1, 12), label="d")
    dv = draw(st.integers(1, 12), label="dv")
    causal = draw(st.booleans(), label="causal")
    block_q = draw(st.integers(1, 16), label="block_q")
    block_k = draw(st.integers(1, 16), label="block_k")
    q, k, v = qkv(draw(rngs), batch, W * per_shard, d, dv)
    kw = dict(world_size=W, layout=layout, causal=causal, block_q=block_q, block_k=block_k)
    return q, k, v, kw


@settings(max_examples=100, deadline=None)
@given(problem=problems())
def test_ring_equals_naive_for_any_world_size_and_layout(problem):
    q, k, v, kw = problem
    with no_warnings():
        O, lse, schedule = ring_attention(q, k, v, return_lse=True, return_schedule=True, **kw)
        O_naive, lse_naive = naive_attention(q, k, v, causal=kw["causal"], return_lse=True)
    assert_close(O, O_naive, RTOL64, "O")
    assert_close(lse, lse_naive, RTOL64, "lse")
    N = q.shape[-2]  # every unmasked pair is computed once, and nothing else
    assert schedule.pairs.sum() == (N * (N + 1) // 2 if kw["causal"] else N * N)


@settings(max_examples=60, deadline=None)
@given(
    rng=rngs,
    W1=st.integers(1, 4),
    W2=st.integers(1, 4),
    m=st.integers(1, 2),
    layout=st.sampled_from(["contiguous", "zigzag"]),
    causal=st.booleans(),
)
def test_result_does_not_depend_on_world_size(rng, W1, W2, m, layout, causal):
    N = 2 * W1 * W2 * m  # divisible as both layouts need, for both world sizes
    q, k, v = qkv(rng, (2,), N, 5, 3)
    a = ring_attention(q, k, v, world_size=W1, layout=layout, causal=causal, return_lse=True)
    b = ring_attention(q, k, v, world_size=W2, layout=layout, causal=causal, return_lse=True)
    assert_close(a[0], b[0], RTOL64, f"O, world sizes {W1} and {W2}")
    assert_close(a[1], b[1], RTOL64, f"lse, world sizes {W1} and {W2}")


@settings(max_examples=60, deadline=None)
@given(rng=rngs, W=st.integers(1, 6), c=st.integers(1, 4), causal=st.booleans())
def test_result_does_not_depend_on_layout(rng, W, c, causal):
    q, k, v = qkv(rng, (), 2 * W * c, 7, 4)
    a = ring_attention(q, k, v, world_size=W, layout="contiguous", causal=causal, return_lse=True)
    b = ring_attention(q, k, v, world_size=W, layout="zigzag", causal=causal, return_lse=True)
    assert_close(a[0], b[0], RTOL64, "O, contiguous vs zigzag")
    assert_close(a[1], b[1], RTOL64, "lse, contiguous vs zigzag")


# ---- the layouts and the schedule ---------------------------------------------------------------


def test_shard_positions_by_hand():
    got = shard_positions(8, 2, "contiguous")
    assert [p.tolist() for p in got] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    got = shard_positions(8, 2, "zigzag")  # chunks 0,1 | 2,3 | 4,5 | 6,7
    assert [p.tolist() for p in got] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    got = shard_positions(8, 4, "zigzag")  # 8 chunks of one: device r holds r and 7 - r
    assert [p.tolist() for p in got] == [[0, 7], [1, 6], [2, 5], [3, 4]]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("W", [1, 2, 3, 5])
def test_shard_positions_are_a_permutation_of_the_sequence(W, layout):
    positions = shard_positions(2 * 3 * W, W, layout)
    assert len(positions) == W and all(len(p) == 6 for p in positions)
    np.testing.assert_array_equal(np.sort(np.concatenate(positions)), np.arange(6 * W))


def test_blocks_travel_one_place_round_the_ring():
    _, schedule = ring_attention(
        *qkv(np.random.default_rng(0), (), 8, 2, 2), world_size=4, return_schedule=True
    )
    # Step s: device r holds the block that started on device r - s (mod 4).
    expected = [[0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 0, 1], [1, 2, 3, 0]]
    np.testing.assert_array_equal(schedule.held, expected)


def pairs_of(N, W, layout, causal=True):
    q, k, v = qkv(np.random.default_rng(0), (), N, 2, 2)
    _, schedule = ring_attention(
        q, k, v, world_size=W, layout=layout, causal=causal, return_schedule=True
    )
    return schedule.pairs  # (steps, devices)


# Contiguous and causal, block length b = N / W: at step s device r holds block j = r - s
# (mod W); its queries see all of it (b * b pairs) if j < r, the lower triangle with the
# diagonal (b (b + 1) / 2) if j == r, nothing if j > r. Device r works at r + 1 steps in all.


def test_contiguous_causal_work_for_two_devices():
    # N = 6, b = 3: diagonal 6, full 9. At step 1, device 0 holds block 1 (all in its future).
    np.testing.assert_array_equal(pairs_of(6, 2, "contiguous"), [[6, 6], [0, 9]])


def test_contiguous_causal_work_for_four_devices():
    # N = 16, b = 4: diagonal 10, full 16.
    pairs = pairs_of(16, 4, "contiguous")
    expected = [
        [10, 10, 10, 10],
        [0, 16, 16, 16],
        [0, 0, 16, 16],
        [0, 0, 0, 16],  # the last step: one device works, three wait
    ]
    np.testing.assert_array_equal(pairs, expected)
    # Per device: 10, 26, 42, 58. The busiest does 58 / 10 = 5.8 times the least busy's work;
    # the ratio 1 + 2 (W - 1) b / (b + 1) tends to 2W - 1 = 7 for long blocks.
    np.testing.assert_array_equal(pairs.sum(axis=0), [10, 26, 42, 58])
    assert pairs.sum() == 16 * 17 // 2


# Zigzag and causal, chunk length c = N / 2W: at step 0 each device sees its own two chunks,
# c (c + 1) / 2 + c * c + c (c + 1) / 2 = 2c^2 + c pairs. At a later step it holds the block
# of device j != r: if j < r, both of its query chunks see all of chunk j and none of chunk
# 2W - 1 - j; if j > r, its early chunk sees nothing and its late chunk sees both. Either way
# 2c^2 pairs: every device does the same work at every step.


def test_zigzag_causal_work_for_two_devices():
    # N = 8, c = 2: step 0 has 2 * 4 + 2 = 10 pairs, step 1 has 8.
    np.testing.assert_array_equal(pairs_of(8, 2, "zigzag"), [[10, 10], [8, 8]])


def test_zigzag_causal_work_for_four_devices():
    # N = 24, c = 3: step 0 has 2 * 9 + 3 = 21 pairs, each later step 18.
    pairs = pairs_of(24, 4, "zigzag")
    np.testing.assert_array_equal(pairs, [[21] * 4] + [[18] * 4] * 3)
    assert pairs.sum() == 24 * 25 // 2


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_without_causal_every_step_is_a_full_block(layout):
    np.testing.assert_array_equal(pairs_of(24, 4, layout, causal=False), np.full((4, 4), 36))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
def test_reported_pairs_are_the_pairs_computed(monkeypatch, layout, causal):
    # Watch every call each simulated device makes: one call per step with work, none for
    # a fully masked step, and the pairs reported are exactly the pairs the call may attend.
    seen = []

    def watched(q, k, v, *, mask=None, **kw):
        seen.append(q.shape[-2] * k.shape[-2] if mask is None else int(mask.sum()))
        return tiled_attention(q, k, v, mask=mask, **kw)

    monkeypatch.setattr(flashref.ring.simulate, "tiled_attention", watched)
    pairs = pairs_of(24, 3, layout, causal)
    assert seen == [p for p in pairs.ravel() if p]  # step by step, device by device


# ---- SoftmaxState.from_output ---------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(rng=rngs, Nk=st.integers(2, 30), split=st.integers(1, 29), causal=st.booleans())
def test_merging_two_finished_results_is_attention_over_all_keys(rng, Nk, split, causal):
    split = min(split, Nk - 1)  # two non-empty halves of the keys
    q, k, v = qkv(rng, (2,), Nk, 6, 4)
    mask = np.tril(np.ones((Nk, Nk), dtype=bool)) if causal else None  # (Nq, Nk)
    halves = []
    for cols in (slice(0, split), slice(split, Nk)):
        half_mask = None if mask is None else mask[:, cols]
        O, lse = naive_attention(
            q, k[..., cols, :], v[..., cols, :], mask=half_mask, return_lse=True
        )
        halves.append(SoftmaxState.from_output(O, lse))  # causal: some rows see no key here
    with no_warnings():
        merged = merge_states(*halves)
    O_ref, lse_ref = attention_ref(q, k, v, causal=causal)
    assert_close(merged.result(), O_ref, RTOL64, "O")
    assert_close(merged.lse(), lse_ref, RTOL64, "lse")


def test_from_output_gives_back_what_it_was_given():
    rng = np.random.default_rng(2)
    O, lse = naive_attention(*qkv(rng, (3,), 5, 4, 2), return_lse=True)
    state = SoftmaxState.from_output(O, lse)
    np.testing.assert_array_equal(state.m, lse)
    np.testing.assert_array_equal(state.l, np.ones(lse.shape))
    assert state.result().tobytes() == O.tobytes()  # o / 1
    assert state.lse().tobytes() == lse.tobytes()  # lse + log(1)


def test_from_output_rows_that_saw_nothing_are_the_empty_state():
    O = np.array([[1.0, 2.0], [0.0, 0.0], [5.0, 5.0]])
    lse = np.array([0.5, -np.inf, -np.inf])
    with no_warnings():
        state = SoftmaxState.from_output(O, lse)
    np.testing.assert_array_equal(state.m, [0.5, -np.inf, -np.inf])
    np.testing.assert_array_equal(state.l, [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(state.o, [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]])


def test_from_output_keeps_the_common_dtype():
    O = np.zeros((4, 3), dtype=np.float16)
    lse = np.zeros(4, dtype=np.float32)
    state = SoftmaxState.from_output(O, lse)
    assert state.m.dtype == state.l.dtype == state.o.dtype == np.float32


# ---- errors: every check runs before any work ------------------------------------------------


@pytest.fixture
def no_work(monkeypatch):
    """Any attention call inside ring_attention fails the test: errors must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("tiled_attention was called before the arguments were checked")

    monkeypatch.setattr(flashref.ring.simulate, "tiled_attention", refuse)


def expect(exc_type, call, *needles):
    with pytest.raises(exc_type) as info:
        call()
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {str(info.value)!r}"


Q, K, V = qkv(np.random.default_rng(0), (2,), 12, 4, 3)


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize(
    "world_size, exc, needles",
    [
        (True, TypeError, ("world_size must be an int, got bool",)),
        (2.0, TypeError, ("world_size must be an int, got float",)),
        ("2", TypeError, ("world_size must be an int, got str",)),
        (0, ValueError, ("world_size must be >= 1, got 0",)),
        (-3, ValueError, ("world_size must be >= 1, got -3",)),
    ],
)
def test_bad_world_size(world_size, exc, needles):
    expect(exc, lambda: ring_attention(Q, K, V, world_size=world_size), *needles)


def test_numpy_integer_world_size_is_accepted():
    O = ring_attention(Q, K, V, world_size=np.int64(3))
    assert_close(O, naive_attention(Q, K, V), RTOL64, "O")


@pytest.mark.usefixtures("no_work")
def test_bad_layout():
    expect(
        ValueError,
        lambda: ring_attention(Q, K, V, world_size=2, layout="striped"),
        "layout must be 'contiguous' or 'zigzag'",
        "'striped'",
    )
    expect(
        TypeError,
        lambda: ring_attention(Q, K, V, world_size=2, layout=1),
        "layout must be 'contiguous' or 'zigzag'",
        "got int",
    )


@pytest.mark.usefixtures("no_work")
def test_sequence_not_divisible_as_the_layout_needs():
    # N = 12: contiguous needs a multiple of W (5 fails), zigzag of 2W (W = 4 needs 8, fails;
    # W = 3 needs 6, fine, and W = 12 contiguous is fine).
    expect(
        ValueError,
        lambda: ring_attention(Q, K, V, world_size=5),
        "contiguous",
        "world_size = 5",
        "multiple of 5",
        "got N = 12",
    )
    expect(
        ValueError,
        lambda: ring_attention(Q, K, V, world_size=4, layout="zigzag"),
        "zigzag",
        "2 * world_size = 8",
        "multiple of 8",
        "got N = 12",
    )
    expect(ValueError, lambda: shard_positions(12, 5), "multiple of 5", "got N = 12")


def test_sequences_that_divide_are_accepted():
    for W, layout in ((3, "zigzag"), (12, "contiguous"), (6, "zigzag")):
        O = ring_attention(Q, K, V, world_size=W, layout=layout)
        assert_close(O, naive_attention(Q, K, V), RTOL64, f"O, W = {W} {layout}")


@pytest.mark.usefixtures("no_work")
def test_queries_and_keys_of_different_lengths():
    expect(
        ValueError,
        lambda: ring_attention(Q[..., :6, :], K, V, world_size=2),
        "shards one sequence",
        "6 queries",
        "12 keys",
    )


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("name", ["causal", "return_lse", "return_schedule"])
@pytest.mark.parametrize("value, type_name", [("yes", "str"), (1, "int"), (None, "NoneType")])
def test_flags_must_be_bools(name, value, type_name):
    if name == "causal":  # the causal spellings: bools, "top_left", "bottom_right"
        error, want = causal_refusal(value)
    else:
        error, want = TypeError, f"{name} must be a bool, got {type_name}"
    expect(error, lambda: ring_attention(Q, K, V, world_size=2, **{name: value}), want)


@pytest.mark.usefixtures("no_work")
def test_shape_dtype_scale_and_block_errors_come_first():
    expect(ValueError, lambda: ring_attention(Q, K[..., :3], V, world_size=2), "head dim 4")
    expect(TypeError, lambda: ring_attention(Q.astype(int), K, V, world_size=2), "q has dtype")
    expect(TypeError, lambda: ring_attention(Q, K, V, world_size=2, scale="1"), "scale must")
    expect(ValueError, lambda: ring_attention(Q, K, V, world_size=2, block_k=0), "block_k")


def test_shard_positions_errors():
    expect(TypeError, lambda: shard_positions(8.0, 2), "N must be an int, got float")
    expect(ValueError, lambda: shard_positions(-2, 2), "N must be >= 0, got -2")
    expect(TypeError, lambda: shard_positions(8, False), "world_size must be an int, got bool")


def test_check_flag():
    assert check_flag(np.bool_(True), "causal") is True  # NumPy bools are accepted
    assert check_flag(False, "causal") is False
    expect(TypeError, lambda: check_flag("True", "causal"), "causal must be a bool, got str")
    O = ring_attention(Q, K, V, world_size=2, causal=np.bool_(True))
    assert_close(O, naive_attention(Q, K, V, causal=True), RTOL64, "O")


def test_from_output_errors():
    expect(
        ValueError,
        lambda: SoftmaxState.from_output(np.zeros((4, 3)), np.zeros(3)),
        "o has shape (4, 3) and lse (3,)",
    )
    expect(ValueError, lambda: SoftmaxState.from_output(np.zeros(()), np.zeros(())), "o (..., dv)")
    expect(
        TypeError,
        lambda: SoftmaxState.from_output(np.zeros((4, 3), dtype=int), np.zeros(4)),
        "o has dtype int64",
    )
