"""Fixtures the test folders share. (The hooks that skip GPU tests and GPU notebook cells
without a GPU are in the repository's conftest.py, which covers notebooks/ too.)

* ``cp``: CuPy, for tests marked ``gpu`` (which are skipped before it is asked for where
  there is no GPU);
* ``torch`` (skipped with why where torch is not installed) and ``fg`` (``flashref.gpu``):
  for the GPU tests that take torch tensors;
* ``no_cupy``: imports of CuPy fail, as on a machine without it.

This folder is on ``sys.path`` while the tests run (pytest puts a ``conftest.py``'s folder
there), so the helpers beside this file import by name: ``reference`` (independent float64
references), ``exercise_report`` (what the exercise tests read in a checker's report),
``cupy_standin`` (CuPy and the driver stood in for on a CPU: launches recorded, not run) and
``call_path`` (the modules an argument passes through from a call to its launch).
Test folders mirror the library's families: ``core/`` (the NumPy modules), ``exercises/``,
``gpu/`` (the forward kernels, their models and compile checks), ``backward/``, ``decode/``,
``ring/``, ``bench/``, ``book/``. What a test needs from the machine is in its markers
(``gpu``, ``nvcc``), not in its name.
"""

from __future__ import annotations

import builtins
import sys

import pytest


@pytest.fixture(scope="session")
def cp():
    """CuPy, with a GPU (``flashref.gpu._runtime.require_gpu``)."""
    from flashref.gpu._runtime import require_gpu

    return require_gpu()


@pytest.fixture(scope="session")
def torch():
    """torch (the baselines, torch-tensor calls and flashref.torch); the test is skipped,
    saying why, where it is not installed."""
    return pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


@pytest.fixture(scope="session")
def fg():
    """flashref.gpu."""
    import flashref.gpu

    return flashref.gpu


@pytest.fixture
def no_cupy(monkeypatch):
    """Imports of CuPy fail, as on a machine without it: for the checks that run before any GPU
    work, and for the messages that say what is missing."""
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "cupy" or name.startswith("cupy."):
            raise ImportError("No module named 'cupy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
