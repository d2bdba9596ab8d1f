"""What chapter 10 and its appendix print: flashref.recorded.decode, decode_timing_report,
the decode figures' models and listing.lines, on the recorded files and on made-up rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashref.gpu import listing
from flashref.hardware import decode_figures as figs
from flashref.recorded import decode as dr
from flashref.recorded import decode_timing as timing

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.fixture(scope="module")
def run():
    return dr.DecodeRun.load(RESULTS / "gpu_decode.json", 7, 7)


@pytest.fixture(scope="module")
def serving():
    return json.loads((RESULTS / "gpu_serving.json").read_text())


def test_replayed_counts_agree_with_the_rows(run):
    pairs = [
        (s, run.row[s, run.ours]["graph_gbps"] / run.row[s, "sdpa_cudnn"]["graph_gbps"])
        for s in run.graph
    ]
    at = sum(x >= 1 for _, x in pairs)
    lines = dr.replayed_lines(run, dtypes=("float16",))
    assert f"  >= 1.0x cuDNN: {at} of {len(pairs)};" in "\n".join(lines)
    table = [ln for ln in lines if ln.startswith("fp16 ")]
    assert len(table) == sum(s[0] == "float16" for s in run.graph)
    assert not any(ln.startswith("bf16 ") for ln in lines)


def test_version_rule_matches_the_defaults(run):
    from flashref.gpu.decode import DEFAULT_VERSION, SM90A_VERSIONS, default_decode_version

    lines = dr.version_lines(run, SM90A_VERSIONS, (default_decode_version((9, 0)), DEFAULT_VERSION))
    assert any(ln.endswith("the same: True") for ln in lines)
    assert len([ln for ln in lines if ln.strip().split()[0].isdigit()]) == len(
        run.meta["decode_versions"]
    )


def test_serving_lines_read_the_file(serving):
    gen = "\n".join(dr.generation_lines(serving))
    for r in serving["generation"]:
        assert f"greedy sequences identical: {r['sequences_equal']} of {r['B']}" in gen
    dtypes = {r["dtype"] for r in serving["decode"]}
    paged = dr.paged_decode_lines(serving)
    fp16 = [r for r in serving["decode"] if r["dtype"] == "float16"]
    assert len([ln for ln in paged if ln.startswith("fp16")]) == len(fp16)
    assert len(paged) == 2 + len(fp16) + 2 * len(dtypes)  # a summary of two lines per dtype
    appended = [r for r in serving["append"] if r["dtype"] == "float16"]
    assert len(dr.append_lines(serving)) == 2 + len(appended) + len(dtypes) - 1
    prov = dr.serving_provenance_lines(serving, "x")
    assert serving["meta"]["commit"][:7] in prov[0]
    for name, h in serving["meta"]["other_sources"].items():
        assert name in "\n".join(prov) and h in "\n".join(prov)
    rows = dr.prefill_lines(serving)
    n = len(serving["prefill"])
    assert len(rows) == 6 + 2 * n
    for r, line in zip(serving["prefill"], rows[2:], strict=False):
        assert f"{r['chunked_us']:.0f}" in line and f"{r['ratio_to_one_forward']:.2f}" in line
        assert f"{r['chunked_one_split_us']:.0f}" in line
    for r, line in zip(serving["prefill"], rows[-n:], strict=True):
        fixed, per_tile = dr.prefill_fit(
            r["chunk_kernel_us"]["default"], r["chunk_longest_tiles"]["default"]
        )
        assert f"fixed {fixed:.1f} us, {per_tile:.2f} us per tile" in line
        assert len(r["chunk_kernel_us"]["default"]) == r["N"] // r["chunk"]
    gaps = [g for r in serving["generation"] for g in r["gap_at_difference"] if g is not None]
    assert f"{max(gaps):.3f}" in "\n".join(dr.generation_lines(serving))


def test_prefill_fit_recovers_a_line():
    tiles = [4, 8, 12, 16, 20]
    fixed, per_tile = dr.prefill_fit([7.0 + 1.5 * t for t in tiles], tiles)
    assert abs(fixed - 7.0) < 1e-9 and abs(per_tile - 1.5) < 1e-9


def test_generation_lines_name_where_sequences_part():
    row = {
        "B": 2,
        "flashref_tokens_per_s": 10.0,
        "sdpa_tokens_per_s": 5.0,
        "ratio_tokens_per_s": 2.0,
        "flashref_step_us": 1.0,
        "sdpa_step_us": 2.0,
        "flashref_loop_copies": {"HtoD": 0, "DtoH": 0},
        "sdpa_loop_copies": {"HtoD": 0, "DtoH": 0},
        "flashref_loop_host_copies": 0,
        "sequences_equal": 1,
        "first_difference": [None, 7],
    }
    data = {
        "meta": {
            "generation_model": {
                "config": {"n_layers": 1, "d_model": 8, "n_heads": 1, "context": 16},
                "train_steps": 1,
                "prompt": 4,
                "new_tokens": 8,
            }
        },
        "generation": [row],
    }
    text = "\n".join(dr.generation_lines(data))
    assert "identical: 1 of 2, first differences at tokens [7]" in text
    assert "flashref HtoD 0, DtoH 0" in text


def test_timing_report_reads_every_file(run):
    assert timing.timed_table(run)[0].startswith("GB/s of K and V")
    assert timing.split_sweep([RESULTS / "gpu_decode_splits.json"])[0].startswith(
        "gpu_decode_splits.json: "
    )
    assert "counters" in timing.profile_v7(RESULTS / "gpu_decode_profile_v7.json")[0]
    missing = timing.profile_v7(RESULTS / "no_such_profile.json")
    assert missing[0].startswith("no recorded profile")


def test_prefill_stamps_print_every_row_and_its_share(tmp_path):
    data = json.loads((RESULTS / "gpu_prefill_stamps.json").read_text())
    # the columns name every stamp the tool records, in its order (a renamed stamp fails here)
    assert [k for _, k in timing.STAMP_COLUMNS] == data["meta"]["stamps"]
    lines = timing.prefill_stamps(RESULTS / "gpu_prefill_stamps.json")
    assert data["meta"]["commit"][:7] in lines[1]
    rows = [ln for ln in lines if "|" in ln][1:]  # the table, under its header
    assert len(rows) == len(data["rows"])
    for r, ln in zip(data["rows"], rows, strict=True):
        cells = ln.replace("|", " ").split()
        assert [int(x) for x in cells[:5]] == [r["H"], r["d"], r["Nq"], r["L"], r["blocks"]]
        want = [r["stamps_us"][k] for _, k in timing.STAMP_COLUMNS] + [r["last_end_us"]]
        assert [float(x) for x in cells[5:]] == pytest.approx(want, abs=0.005)
    # the share: made-up stamps, 2 us before the first tile, 1 after the last, of 6
    made = {
        "meta": {**data["meta"]},
        "rows": [
            {
                **data["rows"][0],
                "stamps_us": {
                    **data["rows"][0]["stamps_us"],
                    "tile0_landed": 2.0,
                    "loop_done": 5.0,
                    "end": 6.0,
                },
            }
        ],
    }
    (tmp_path / "s.json").write_text(json.dumps(made))
    assert timing.prefill_stamps(tmp_path / "s.json")[-1].endswith("2.00 + 1.00 of 6.00 us: 50%")
    assert timing.prefill_stamps(tmp_path / "none.json")[0].startswith("no recorded stamps")


def test_serving_provenance_says_when_the_gpu_differs(serving):
    gpu = serving["meta"]["gpu"]
    same = dr.serving_provenance_lines(serving, "x", ("the decode run", gpu))
    assert same == dr.serving_provenance_lines(serving, "x")
    other = "\n".join(dr.serving_provenance_lines(serving, "x", ("the decode run", "GPU Z")))
    assert "another GPU than the decode run (GPU Z)" in other


def test_packed_rows_follow_the_kernel():
    rows = figs.packed_rows(4, 3)  # row R = g Nq + i, zeros past G Nq
    assert rows[:12] == [(g, i) for g in range(4) for i in range(3)]
    assert rows[12:] == [None] * 4
    with pytest.raises(ValueError, match="positive"):
        figs.packed_rows(0)


@pytest.mark.parametrize(("L", "S"), [(1000, 3), (64, 4), (0, 2), (4096, 16), (130, 1)])
def test_split_keys_cut_the_keys_at_tiles(L, S):
    parts = figs.split_keys(L, S)
    assert len(parts) == S
    assert [k for r in parts for k in r] == list(range(L))
    assert all(r.start % 64 == 0 or r.start == L for r in parts)


def test_figures_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for fig in (figs.draw_decode_kernel(), figs.draw_serving_step()):
        assert fig.get_axes()
        plt.close(fig)


def test_listing_lines_fold_and_drop():
    text = listing.lines(
        "decode/v07_early_tiles.cu",
        "for (int it = 0; it < n_tiles; it++) {",
        "mbar_arrive(empty",
        fold=[("// online softmax", "// O += P V")],
        drop=["#pragma unroll"],
    )
    lines = text.splitlines()
    assert "for (int it = 0; it < n_tiles" in lines[0] and "mbar_arrive(empty" in lines[-1]
    assert "#pragma unroll" not in text
    i = next(k for k, ln in enumerate(lines) if "// online softmax" in ln)
    assert lines[i + 1].strip().startswith("// ... ") and "// O += P V" in lines[i + 2]
    with pytest.raises(ValueError, match="no line"):
        listing.lines("decode/v07_early_tiles.cu", "no such text", "x")
