"""``flashref.results_dir()``: where the chapters read the recorded measurements."""

from __future__ import annotations

from pathlib import Path

import pytest

import flashref

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_reads_its_own_results(monkeypatch):
    monkeypatch.delenv(flashref.RESULTS_ENV, raising=False)
    assert flashref.results_dir() == ROOT / "results"
    assert (flashref.results_dir() / "gpu_bench.json").is_file()


def test_the_environment_points_elsewhere(monkeypatch, tmp_path):
    monkeypatch.setenv(flashref.RESULTS_ENV, str(tmp_path))
    assert flashref.results_dir() == tmp_path
    monkeypatch.setenv(flashref.RESULTS_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="FLASHREF_RESULTS is .*nowhere.*not a folder"):
        flashref.results_dir()


def test_outside_a_checkout_it_says_what_to_do(monkeypatch, tmp_path):
    """A package installed from a wheel has no results/ beside it: the error names where it
    looked, the clone and the environment variable."""
    monkeypatch.delenv(flashref.RESULTS_ENV, raising=False)
    fake = tmp_path / "site-packages" / "flashref" / "__init__.py"
    monkeypatch.setattr(flashref, "__file__", str(fake))
    with pytest.raises(FileNotFoundError) as exc:
        flashref.results_dir()
    text = str(exc.value)
    assert str(tmp_path / "site-packages" / "results") in text
    assert "clone" in text and "FLASHREF_RESULTS" in text
