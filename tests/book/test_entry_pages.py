"""The entry pages count what the code has: the README's numbers of forward, Hopper, backward
and decode versions are read from its first paragraph and compared with the registries, so a
new version that the README does not mention fails here; the book's entry pages (intro,
how_to_read, glossary) name version ranges that are read from the registries too, and the
chapters with GPU cells."""

from __future__ import annotations

import re
from pathlib import Path

from flashref.gpu.backward_versions import BWD_VERSIONS
from flashref.gpu.decode.versions import SM90A_VERSIONS as SM90A_DECODE
from flashref.gpu.decode.versions import VERSIONS as DECODE_VERSIONS
from flashref.gpu.forward_versions import VERSIONS

ROOT = Path(__file__).resolve().parents[2]
WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen twenty"
).split()
TENS = {"twenty": 20, "thirty": 30, "forty": 40}


def number(word: str) -> int:
    """``"thirty"``, ``"twenty-eight"``, ``"seven"`` or ``"12"`` as an int."""
    word = word.lower()
    if word.isdigit():
        return int(word)
    if word in WORDS:
        return WORDS.index(word)
    tens, _, ones = word.partition("-")
    return TENS[tens] + (WORDS.index(ones) if ones else 0)


def intro() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return " ".join(text.split("\n\n")[1].split())  # the first paragraph, on one line


def test_number_words():
    assert [number(w) for w in ("seven", "twelve", "thirty", "twenty-eight", "3")] == [
        7,
        12,
        30,
        28,
        3,
    ]


def test_readme_counts_the_forward_versions_and_the_hopper_ones():
    text = intro()
    found = re.search(r"([\w-]+) numbered forward versions", text)
    assert found, "the README's first paragraph no longer says how many forward versions"
    assert number(found.group(1)) == len(VERSIONS)
    hopper = re.search(r"the last ([\w-]+) on Hopper's", text)
    assert hopper and number(hopper.group(1)) == sum(v.arch == "sm_90a" for v in VERSIONS.values())


def test_readme_counts_the_backward_and_decode_versions():
    text = intro()
    backward = re.search(r"backward pass \(([\w-]+) versions", text)
    assert backward and number(backward.group(1)) == len(BWD_VERSIONS)
    decode = re.search(r"\(([\w-]+) kernel versions, the last ([\w-]+) on TMA\)", text)
    assert decode, "the README's first paragraph no longer counts the decode versions"
    assert number(decode.group(1)) == len(DECODE_VERSIONS)
    assert number(decode.group(2)) == sum(v.arch == "sm_90a" for v in DECODE_VERSIONS.values())


# --- the book's entry pages -------------------------------------------------------------------


def page(name: str) -> str:
    return " ".join((ROOT / "book" / name).read_text(encoding="utf-8").split())


def span(numbers) -> tuple[int, int]:
    numbers = sorted(numbers)
    assert numbers == list(range(numbers[0], numbers[-1] + 1)), numbers  # one run
    return numbers[0], numbers[-1]


def on_hopper(family) -> set[int]:
    return {n for n, v in family.items() if v.arch == "sm_90a"}


def test_intro_counts_the_backward_versions():
    found = re.search(
        r"\(versions 1 to (\d+), (\d+) to (\d+) on Hopper's `wgmma`\)", page("intro.md")
    )
    assert found, "intro.md no longer says which backward versions there are"
    assert int(found.group(1)) == max(BWD_VERSIONS)
    assert tuple(map(int, found.group(2, 3))) == span(on_hopper(BWD_VERSIONS))


def test_how_to_read_names_the_versions_each_gpu_needs():
    text = page("how_to_read.md")
    mma = {n for n, v in VERSIONS.items() if v.min_cc == (8, 0)}
    assert f"versions {span(mma)[0]} to {span(mma)[1]} (any CUDA GPU for 1 and 2)" in text
    assert all(VERSIONS[n].min_cc < (8, 0) for n in (1, 2))
    low = span(set(BWD_VERSIONS) - on_hopper(BWD_VERSIONS))
    high = span(on_hopper(BWD_VERSIONS))
    assert (
        f"versions {low[0]} to {low[1]}, 9.0 (Hopper) for versions {high[0]} to {high[1]}" in text
    )
    tma = span(SM90A_DECODE)
    rest = span(set(DECODE_VERSIONS) - set(SM90A_DECODE))
    assert f"decode versions {rest[0]} to {rest[1]}, 9.0 for {tma[0]} to {tma[1]}" in text


def test_glossary_names_the_warp_specialised_versions():
    text = page("glossary.md")
    producer = span(n for n, v in BWD_VERSIONS.items() if v.tma)
    sender = span(n for n, v in BWD_VERSIONS.items() if v.dq_writer)
    assert f"backward versions {producer[0]} to {producer[1]} in" in text
    assert f"({sender[0]} to {sender[1]} with a warp that only sends $dQ$)" in text
    assert "decode versions {} to {} in".format(*span(SM90A_DECODE)) in text


# The notebooks with cells tagged gpu: intro.md and how_to_read.md say which they are (and on
# which card their outputs were made); a chapter that gains or loses GPU cells fails here until
# those pages say so.
GPU_CHAPTERS = {
    "05_appendix_measurements",
    "07_beyond_fa2",
    "08_appendix_measurements",
    "08_backward",
    "09_ring_attention",
    "10_inference",
    "11_hopper",
}


def test_the_pages_know_which_chapters_have_gpu_cells():
    import json

    found = set()
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        if any("gpu" in c.get("metadata", {}).get("tags", []) for c in cells):
            found.add(path.stem)
    assert found == GPU_CHAPTERS
    assert "(chapter 5's appendix, chapters 7 to 11 and chapter 8's appendix)" in page("intro.md")
