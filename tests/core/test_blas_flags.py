"""The one warning flashref drops: "invalid value encountered in matmul" from a product
computed in a flashref module (some OpenBLAS kernels raise that flag on finite inputs;
flashref/_blas_flags.py says why it is not a NaN). Anything else still warns."""

import contextlib
import subprocess
import sys
import warnings

import numpy as np
import pytest

from flashref._blas_flags import MESSAGE, ignore_stray_matmul_flag


@contextlib.contextmanager
def as_after_import_under_w_error():
    """The filters of ``python -W error`` after ``import flashref``: every warning is an
    error but the one flashref drops from its own modules (the tests' shared no_warnings()
    drops it everywhere, so it cannot show the scope)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ignore_stray_matmul_flag()
        yield


def product_in(module_name, a, b):
    """``a @ b`` computed by code whose module is ``module_name``, as NumPy sees it."""
    scope = {"__name__": module_name, "a": a, "b": b}
    exec("out = a @ b", scope)  # noqa: S102 (the point: a frame in another module)
    return scope["out"]


# inf * 0 raises the invalid-operation flag in any BLAS and in NumPy's own loops.
INVALID = (np.array([[np.inf, 1.0]]), np.array([[0.0], [1.0]]))


def run_with_warnings_as_errors(code):
    """``code`` in a fresh interpreter started with ``-W error`` (pytest's own warning
    handling would hide what importing flashref does to the filters)."""
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120
    )


def test_importing_flashref_drops_the_flag_from_its_products_only():
    # A genuine invalid operation (inf * 0) in flashref's product: no warning, NaN out.
    # The same product in the caller's code, after the import, still warns.
    code = (
        "import numpy as np, flashref\n"
        "q = np.array([[np.inf, 1.0]]); k = np.array([[0.0, 1.0], [1.0, 0.0]])\n"
        "print(np.isnan(flashref.naive_attention(q, k, np.ones((2, 3)))).all())\n"
        "q @ k.T\n"
    )
    done = run_with_warnings_as_errors(code)
    assert done.stdout == "True\n"
    assert done.returncode == 1 and f"RuntimeWarning: {MESSAGE}" in done.stderr


def test_invalid_flag_in_a_flashref_module_is_dropped():
    with as_after_import_under_w_error():
        out = product_in("flashref.attention", *INVALID)
    assert np.isnan(out[0, 0])  # the NaN itself stays in the result


@pytest.mark.parametrize("module_name", ["__main__", "tests.core.test_blas_flags", "flashrefx"])
def test_invalid_flag_elsewhere_still_warns(module_name):
    with as_after_import_under_w_error(), pytest.raises(RuntimeWarning, match=MESSAGE):
        product_in(module_name, *INVALID)


def test_overflow_in_a_flashref_module_still_warns():
    big = np.array([[1e300, 1e300]])
    overflow = "overflow encountered in matmul"
    with as_after_import_under_w_error(), pytest.raises(RuntimeWarning, match=overflow):
        product_in("flashref.attention", big, big.T)


def test_other_invalid_values_in_a_flashref_module_still_warn():
    scope = {"__name__": "flashref.softmax", "np": np}
    with (
        as_after_import_under_w_error(),
        pytest.raises(RuntimeWarning, match="invalid value encountered in subtract"),
    ):
        exec("np.array([np.inf]) - np.array([np.inf])", scope)  # noqa: S102
