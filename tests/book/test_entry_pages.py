"""The entry pages count what the code has: the README's numbers of forward, Hopper, backward
and decode versions are read from its first paragraph and compared with the registries, so a
new version that the README does not mention fails here."""

from __future__ import annotations

import re
from pathlib import Path

from flashref.gpu.backward_versions import BWD_VERSIONS
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
