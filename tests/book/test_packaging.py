"""The package's metadata says what it ships, once: the version in one place, the build floor
the license string needs, every kernel source in the package data, a LICENSE file."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import flashref

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "flashref.__version__"}
    assert flashref.__version__.count(".") == 2


def test_the_build_floor_reads_the_license_string_and_the_license_ships():
    """An SPDX string in project.license needs setuptools 77 (68 fails the build)."""
    assert isinstance(PYPROJECT["project"]["license"], str)
    (floor,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    assert floor.replace(" ", "") == "setuptools>=77"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    assert "MIT License" in (ROOT / "LICENSE").read_text()


def test_every_kernel_source_is_package_data():
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["flashref"]
    package = ROOT / "flashref"
    sources = [p.relative_to(package).as_posix() for p in (package / "kernels").rglob("*.cu*")]
    assert len(sources) > 50
    missed = [s for s in sources if not any(fnmatch.fnmatch(s, pat) for pat in patterns)]
    assert not missed, missed


def test_the_extras_bring_what_their_modules_import():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert any(r.startswith("torch") for r in extras["torch"])
    for cuda in ("cuda12", "cuda13"):  # CuPy's CUDA libraries, NVRTC among them
        assert any(r.startswith(f"cupy-{cuda}x[ctk]") for r in extras[cuda]), extras[cuda]
    assert any(r.startswith("threadpoolctl") for r in extras["book"])  # chapter 4 imports it


def test_every_folder_of_python_modules_is_a_package_the_build_finds():
    """A folder of modules without ``__init__.py`` imports from a checkout (a namespace
    package) but is left out of a built wheel by ``packages.find``: every one is a package."""
    from setuptools import find_packages

    package = ROOT / "flashref"
    folders = {p.parent for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    found = set(
        find_packages(
            str(ROOT), include=PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
        )
    )
    missing = sorted(
        ".".join(f.relative_to(ROOT).parts)
        for f in folders
        if ".".join(f.relative_to(ROOT).parts) not in found
    )
    assert not missing, missing


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"{path.name}: {line!r} is not an exact pin"
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_the_lock_pins_everything_requirements_names_at_the_same_versions():
    """constraints.txt (every package make installs, transitive ones included) holds each of
    requirements.txt's packages at the version requirements.txt pins, and pip itself; make
    installs with it."""
    lock, wanted = _pins(ROOT / "constraints.txt"), _pins(ROOT / "requirements.txt")
    assert "pip" in lock and len(lock) > 2 * len(wanted)
    for name, version in wanted.items():
        assert lock.get(name) == version, f"constraints.txt has {name}=={lock.get(name)}"
    makefile = (ROOT / "Makefile").read_text()
    assert "-c constraints.txt -r requirements.txt" in makefile
