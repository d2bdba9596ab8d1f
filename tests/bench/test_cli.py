"""The harness's commands without a GPU: help that lists the subcommands and shows every
option's default (exit 0), and one line naming what is missing (exit 3) instead of a
traceback. Each command runs in a process of its own, as a reader runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flashref.bench.__main__ import TARGETS
from flashref.gpu import available

ROOT = Path(__file__).resolve().parents[2]
SUBCOMMANDS = tuple(TARGETS)  # every program of the harness


def _run(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


def test_help_lists_the_subcommands_and_exits_0():
    proc = _run("flashref.bench", "--help")
    assert proc.returncode == 0, proc.stderr
    for name in SUBCOMMANDS:
        assert f"\n  {name} " in proc.stdout
    assert "\ndecode and serving:\n" in proc.stdout  # grouped by family
    assert "3 something the command needs" in proc.stdout
    bad = _run("flashref.bench", "nope")
    assert bad.returncode == 2 and "unknown subcommand 'nope'" in bad.stderr


@pytest.mark.parametrize(
    "args", [("flashref.bench", s) for s in SUBCOMMANDS], ids=lambda a: " ".join(a)
)
def test_every_command_shows_its_defaults(args):
    proc = _run(*args, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "(default:" in proc.stdout or "default:" in proc.stdout, proc.stdout


@pytest.mark.skipif(available(), reason="this machine has a GPU: the commands would run")
@pytest.mark.parametrize(
    "args",
    [
        ("flashref.bench", "gpu"),
        ("flashref.bench", "decode"),
        ("flashref.bench", "calls"),
        ("flashref.bench", "roofs"),
        ("flashref.bench", "selfcheck"),
        ("flashref.bench", "host_profile"),
    ],
    ids=lambda a: " ".join(a),
)
def test_without_a_gpu_one_line_says_what_is_missing(args):
    proc = _run(*args)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "flashref.gpu cannot run" in proc.stderr


@pytest.mark.parametrize(
    "flags, unknown, known",
    [
        ([], "99", "1, 2, 3"),
        (["--decode"], "9", "1, 2, 3, 4, 5, 6, 7)"),
        (["--backward"], "42", "1, 2, 3"),
        (["--hopper"], "3", "(14, 19, 20"),
    ],
)
def test_profile_refuses_versions_it_would_not_profile(flags, unknown, known, capsys):
    """``profile --versions`` names a version of the family the run profiles, or the run
    stops before anything (else it would profile nothing and overwrite its results file)."""
    from flashref.bench.profile import main as profile

    with pytest.raises(SystemExit) as exc:
        profile.main([*flags, "--versions", unknown])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--versions {unknown}: not among the versions this run profiles" in err, err
    assert known in err, err


@pytest.mark.parametrize(
    "args, option, problem",
    [
        (["cpu", "--block-q", "0"], "--block-q", "must be at least 1, got 0"),
        (["cpu", "--block-k", "-3"], "--block-k", "must be at least 1, got -3"),
        (["cpu", "--big", "-5"], "--big", "must be at least 0, got -5"),
        (["cpu", "--sweep-n", "-5"], "--sweep-n", "must be at least 0, got -5"),
        (["cpu", "--repeats", "x"], "--repeats", "expected an int, got 'x'"),
        (["gpu", "--rounds", "0"], "--rounds", "must be at least 1, got 0"),
        (["ring", "--cpu", "0", "--seq", "64"], "--cpu", "must be at least 1, got 0"),
    ],
)
def test_a_bad_count_is_a_usage_error_naming_the_option(args, option, problem):
    """A count out of range stops the command before it runs: exit 2, one line naming the
    option (not a traceback, nor an error reached after the whole default run)."""
    proc = subprocess.run(
        [sys.executable, "-m", "flashref.bench", *args], capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    assert f"error: argument {option}: {problem}" in proc.stderr
    assert "Traceback" not in proc.stderr


def _shown_commands() -> list[tuple[str, str, list[str]]]:
    """Every ``python -m flashref.bench SUB ...`` line of the README and the book's pages
    (continuation lines joined): (where, subcommand, its flags)."""
    import re

    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "book").glob("*.md"))]:
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for line in text.splitlines():
            m = re.search(r"python -m flashref\.bench ([a-z_]+)((?: [^`#|]*)?)", line)
            if m:
                flags = re.findall(r"(?<!\S)(--[a-z][a-z0-9-]*)", m.group(2))
                found.append((path.name, m.group(1), flags))
    return found


def test_every_command_the_pages_show_exists_with_its_flags():
    """Each program the README and the book show is a subcommand, and each of its flags is
    one that subcommand's --help lists."""
    shown = _shown_commands()
    assert len(shown) >= 10, shown  # the README's table and examples at least
    helps = {}
    for where, sub, flags in shown:
        assert sub in SUBCOMMANDS, f"{where}: python -m flashref.bench {sub}: no such subcommand"
        if sub not in helps:
            proc = _run("flashref.bench", sub, "--help")
            assert proc.returncode == 0, proc.stderr
            helps[sub] = proc.stdout
        missing = [f for f in flags if f not in helps[sub]]
        assert not missing, f"{where}: python -m flashref.bench {sub}: no option {missing}"


@pytest.mark.skipif(available(), reason="this machine has a GPU: the commands would run")
@pytest.mark.parametrize(
    "sub",
    ["training", "training_step", "serving", "decode_split_sweep", "decode_host_time"]
    + ["prefill_stamps", "backward"],
)
def test_what_this_machine_lacks_is_one_line_and_exit_3(sub):
    """Without a GPU, CuPy or torch, every program says what is missing on one line and exits
    3 (``cli.run``), whichever of them it imports first: never a traceback."""
    proc = _run("flashref.bench", sub)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "is not installed" in proc.stderr or "flashref.gpu cannot run" in proc.stderr
